"""The scheduling predicates against the cases Kubernetes documents for taints, tolerations and node affinity.

(kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration and assign-pod-node;
``Toleration.ToleratesTaint`` in k8s.io/api core/v1.)
"""

from __future__ import annotations

import pytest

from policy.k8s_scheduling import schedulable, selects_node, term_matches, tolerates, untolerated_taints

GPU = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(("toleration", "expected"), [
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),                  # empty effect: any effect
    ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}, True),
    ({"key": "nvidia.com/gpu", "value": "true"}, True),                        # operator defaults to Equal
    ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "false"}, False),
    ({"key": "nvidia.com/gpu", "operator": "Equal"}, False),                   # value "" != "true"
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "PreferNoSchedule"}, False),
    ({"operator": "Exists"}, True),                                            # empty key + Exists: everything
    ({"operator": "Exists", "effect": "NoExecute"}, False),
    ({"key": "CriticalAddonsOnly", "operator": "Exists"}, False),
    ({"key": "nvidia.com/gpu", "operator": "Gt", "value": "0"}, False),        # not a toleration operator
])
def test_toleration_matches_taint(toleration, expected):
    assert tolerates(toleration, GPU) is expected


def test_only_hard_taints_must_be_tolerated():
    soft = {"key": "x", "value": "y", "effect": "PreferNoSchedule"}
    execute = {"key": "z", "value": "", "effect": "NoExecute"}
    assert untolerated_taints([], [soft]) == []
    assert untolerated_taints([], [GPU, soft, execute]) == [GPU, execute]
    assert untolerated_taints([{"key": "z", "operator": "Exists"}], [GPU, execute]) == [GPU]


LABELS = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "ragpool.io/pool": "gpu-spot",
          "node.kubernetes.io/instance-type": "g5.xlarge", "karpenter.k8s.aws/instance-gpu-count": "1"}


def expr(key, operator, *values):
    e = {"key": key, "operator": operator}
    if values:
        e["values"] = list(values)
    return e


@pytest.mark.parametrize(("expressions", "expected"), [
    ([expr("ragpool.io/pool", "In", "gpu-spot", "gpu-ondemand")], True),
    ([expr("ragpool.io/pool", "In", "system")], False),
    ([expr("ragpool.io/pool", "NotIn", "system")], True),
    ([expr("eks.amazonaws.com/compute-type", "NotIn", "fargate")], True),      # NotIn: absent label matches
    ([expr("eks.amazonaws.com/compute-type", "In", "fargate")], False),
    ([expr("karpenter.sh/nodepool", "DoesNotExist")], True),
    ([expr("ragpool.io/pool", "DoesNotExist")], False),
    ([expr("ragpool.io/pool", "Exists")], True),
    ([expr("karpenter.k8s.aws/instance-gpu-count", "Gt", "0")], True),
    ([expr("karpenter.k8s.aws/instance-gpu-count", "Lt", "1")], False),
    ([expr("kubernetes.io/os", "Gt", "0")], False),                           # not an integer
    ([expr("ragpool.io/pool", "In", "gpu-spot"), expr("kubernetes.io/arch", "In", "arm64")], False),  # ANDed
    ([], False),                                                              # an empty term matches nothing
])
def test_node_selector_term(expressions, expected):
    assert term_matches({"matchExpressions": expressions}, LABELS) is expected


def _required(*terms):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_terms_are_ored_and_node_selector_is_anded():
    system = {"matchExpressions": [expr("ragpool.io/pool", "In", "system")]}
    gpu = {"matchExpressions": [expr("ragpool.io/pool", "In", "gpu-spot")]}
    assert selects_node({}, _required(system, gpu), LABELS)
    assert not selects_node({}, _required(system), LABELS)
    assert not selects_node({}, _required(), LABELS)                            # no terms: nothing
    assert selects_node({"kubernetes.io/os": "linux"}, {}, LABELS)
    assert not selects_node({"kubernetes.io/os": "linux", "ragpool.io/pool": "system"}, _required(gpu), LABELS)
    preferred_only = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": system}]}}
    assert selects_node(None, preferred_only, LABELS)                           # preferences never exclude


def test_unknown_operator_is_an_error_not_a_match():
    with pytest.raises(ValueError, match="Approximately"):
        term_matches({"matchExpressions": [expr("a", "Approximately", "b")]}, LABELS)


def test_daemonset_auto_tolerations_do_not_cover_custom_taints():
    pod = {"nodeSelector": {"kubernetes.io/os": "linux"}}
    assert not schedulable(pod, LABELS, [GPU], daemonset=True)
    unschedulable = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    assert schedulable(pod, LABELS, [unschedulable], daemonset=True)
    assert not schedulable(pod, LABELS, [unschedulable], daemonset=False)
