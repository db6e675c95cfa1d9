"""Kubernetes scheduling predicates: may a pod with this spec run on a node with these labels and taints?

The same rules the scheduler (and the DaemonSet controller, which uses them to decide where
its pods go) applies, from k8s.io/api core/v1 and k8s.io/component-helpers:

- a toleration tolerates a taint when its effect is empty or equal, its key is empty (only
  with operator Exists: "tolerate everything") or equal, and operator Exists, or Equal (the
  default) with an equal value (``Toleration.ToleratesTaint``);
- a pod fits a node's taints when every ``NoSchedule`` and ``NoExecute`` taint is tolerated
  (``PreferNoSchedule`` is only a preference);
- ``nodeSelector``: every key present with the same value;
- ``nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``: the ``nodeSelectorTerms``
  are ORed, the expressions of a term ANDed; an empty term list or a term without
  expressions matches nothing; operators In, NotIn (true when the label is absent), Exists,
  DoesNotExist, Gt, Lt (integer comparison; false when absent or not an integer).

Pulumi-free and dependency-free: the policy pack and the tests both import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

HARD_EFFECTS = ("NoSchedule", "NoExecute")

# The DaemonSet controller adds these tolerations to every DaemonSet pod
# (pkg/controller/daemon/util AddOrUpdateDaemonPodTolerations); none covers a custom taint.
DAEMONSET_AUTO_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


def _items(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return list(value)
    return [value]


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``Toleration.ToleratesTaint``."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        # An empty key with Equal is invalid in the API; it matches nothing here.
        return bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def untolerated_taints(tolerations: Any, taints: Any) -> list[Mapping[str, Any]]:
    """The NoSchedule/NoExecute taints no toleration covers (empty: the pod may schedule)."""
    tols = [t for t in _items(tolerations) if isinstance(t, Mapping)]
    return [taint for taint in _items(taints)
            if isinstance(taint, Mapping) and taint.get("effect") in HARD_EFFECTS
            and not any(tolerates(t, taint) for t in tols)]


def tolerates_all(tolerations: Any, taints: Any) -> bool:
    return not untolerated_taints(tolerations, taints)


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expr.get("key"), expr.get("operator")
    values = [str(v) for v in _items(expr.get("values"))]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, IndexError, ValueError):
            return False
        return have > want if operator == "Gt" else have < want
    raise ValueError(f"unknown node selector operator {operator!r}")


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One nodeSelectorTerm (matchFields, on metadata.name only, is not modelled: it never matches)."""
    expressions = [e for e in _items(term.get("matchExpressions")) if isinstance(e, Mapping)]
    if not expressions or _items(term.get("matchFields")):
        return False
    return all(_expression_matches(e, labels) for e in expressions)


def selects_node(node_selector: Any, affinity: Any, labels: Mapping[str, str]) -> bool:
    """nodeSelector and required node affinity both admit a node with ``labels``."""
    if isinstance(node_selector, Mapping):
        if any(labels.get(k) != str(v) for k, v in node_selector.items()):
            return False
    required = None
    if isinstance(affinity, Mapping):
        node_affinity = affinity.get("nodeAffinity")
        if isinstance(node_affinity, Mapping):
            required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, Mapping):
        terms = [t for t in _items(required.get("nodeSelectorTerms")) if isinstance(t, Mapping)]
        return any(term_matches(t, labels) for t in terms)
    return True


def schedulable(pod_spec: Mapping[str, Any], labels: Mapping[str, str], taints: Any, *,
                daemonset: bool = False) -> bool:
    """Would the scheduler (or the DaemonSet controller) place this pod on the node?"""
    tolerations = _items(pod_spec.get("tolerations"))
    if daemonset:
        tolerations += list(DAEMONSET_AUTO_TOLERATIONS)
    return (tolerates_all(tolerations, taints)
            and selects_node(pod_spec.get("nodeSelector"), pod_spec.get("affinity"), labels))
