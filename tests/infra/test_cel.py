"""CRD validation rules (CEL, ``x-kubernetes-validations``) on every custom resource of both plans,
evaluated with cel-python as the API server evaluates them at ``pulumi up`` (policy/cel_eval.py).

kubernetes-validate/jsonschema (tests/infra/test_validation.py) check the OpenAPI schema only;
these rules (about 80 in the pinned Karpenter, KubeRay and KEDA CRDs) were not checked before.
Transition rules (``oldSelf``) need the object's previous version: ``validate_update`` evaluates
them between two plans of a stack (tested here between the committed plan and a changed copy), and
the PR plan-diff job runs them between the PR's base and head plans (``python -m policy.cel_eval
transitions``; tests/test_workflows.py runs the job's script on a forbidden transition).
"""

from __future__ import annotations

import copy
import json

import pytest

from policy.cel_eval import (apply_defaults, crd_schema, has_crd, rule_inventory, transition_failures, validate,
                             validate_update)
from tests.conftest import STACKS
from tests.infra.harness import is_core, kubernetes_objects

# Rules that read oldSelf (only an update has one), of the CRDs whose objects the plans declare;
# CRDs vendored later may add more (rule_inventory lists every one by name).
TRANSITION_RULES = {
    ("karpenter.sh/NodePool", ".spec", "has(self.replicas) == has(oldSelf.replicas)"),
    ("karpenter.sh/NodePool", ".spec.template.spec.nodeClassRef", "self.group == oldSelf.group"),
    ("karpenter.sh/NodePool", ".spec.template.spec.nodeClassRef", "self.kind == oldSelf.kind"),
    ("ray.io/RayCluster", ".spec.gcsFaultToleranceOptions.backend", "self == oldSelf"),
    ("ray.io/RayCluster", ".spec.managedBy", "self == oldSelf"),
    ("ray.io/RayJob", ".spec.managedBy", "self == oldSelf"),
    ("ray.io/RayJob", ".spec.rayClusterSpec.gcsFaultToleranceOptions.backend", "self == oldSelf"),
    ("ray.io/RayJob", ".spec.rayClusterSpec.managedBy", "self == oldSelf"),
}
# Rules calling a function policy/cel_eval.py does not provide (none today).
NOT_EVALUATED: set[tuple[str, str, str]] = set()


def custom_resources(plan: dict) -> list[tuple[dict, dict]]:
    return [(r, obj) for r, obj in kubernetes_objects(plan) if not is_core(obj)]


def _nodepool(plan: dict) -> dict:
    return copy.deepcopy(next(obj for _, obj in custom_resources(plan) if obj["kind"] == "NodePool"))


# ------------------------------------------------------------------ inventory


def test_every_rule_is_evaluated_or_listed_by_name(schemas_dir):
    inventory = rule_inventory()
    transition = {(r.crd, r.path, r.rule) for r in inventory["transition"]}
    assert TRANSITION_RULES <= transition
    assert all("oldSelf" in rule for _, _, rule in transition)
    unsupported = {(r.crd, r.path, r.rule) for r in inventory["unsupported"]}
    assert unsupported == NOT_EVALUATED, "rules cel_eval cannot evaluate:\n" + "\n".join(
        r.name for r in inventory["unsupported"])
    crds = {r.crd for r in inventory["evaluable"]}
    assert {"karpenter.sh/NodePool", "karpenter.k8s.aws/EC2NodeClass", "ray.io/RayCluster"} <= crds
    assert len(inventory["evaluable"]) >= 70


@pytest.mark.parametrize("stack", STACKS)
def test_every_custom_resource_has_its_crd_here(committed_plans, schemas_dir, stack):
    missing = sorted({f"{obj['apiVersion']} {obj['kind']}" for _, obj in custom_resources(committed_plans[stack])
                      if not has_crd(obj)})
    assert missing == [], "custom resources whose CRD (and CEL rules) this check does not know"


# ------------------------------------------------------------------ the plans


@pytest.mark.parametrize("stack", STACKS)
def test_every_cel_rule_holds_on_every_custom_resource(committed_plans, schemas_dir, stack):
    inventory = rule_inventory()
    failures, evaluated = [], {}
    for r, obj in custom_resources(committed_plans[stack]):
        result = validate(obj)
        failures += [f"{obj['kind']} {r['name']}{v}" for v in result.violations]
        evaluated[r["name"]] = result
        # Rules that applied but were not evaluated are only the listed ones.
        listed = {r.name for r in inventory["transition"] + inventory["unsupported"]}
        assert result.skipped <= listed, result.skipped
    assert failures == [], "\n".join(failures)
    kinds = {obj["kind"]: len(evaluated[r["name"]].evaluated) for r, obj in custom_resources(committed_plans[stack])}
    # The walk reaches the rules: a NodePool and an EC2NodeClass each meet more than ten.
    assert kinds["NodePool"] > 10 and kinds["EC2NodeClass"] > 10, kinds


# ------------------------------------------------------------------ the check can fail


def test_a_broken_nodepool_is_refused(committed_plans, schemas_dir):
    pool = _nodepool(committed_plans["dev"])
    assert validate(pool).violations == []
    spec = pool["spec"]["template"]["spec"]
    spec["requirements"].append({"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": []})
    spec["requirements"].append({"key": "karpenter.k8s.aws/not-a-known-key", "operator": "Exists"})
    pool["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})["karpenter.sh/nodepool"] = "x"
    pool["spec"].setdefault("disruption", {})["budgets"] = [{"nodes": "10%", "schedule": "@daily"}]
    violations = validate(pool).violations
    text = "\n".join(violations)
    assert "x.operator == 'In' ? x.values.size() != 0" in text                         # In with no values
    assert any(v.startswith(".spec.template.spec.requirements[") and "karpenter.k8s.aws/instance-tenancy" in v
               for v in violations), text                                                # AWS copy: unknown key
    assert any(v.startswith(".spec.template.metadata.labels") and 'x != "karpenter.sh/nodepool"' in v
               for v in violations), text                                                # restricted label
    assert any(v.startswith(".spec.disruption.budgets") and "has(x.schedule) == has(x.duration)" in v
               for v in violations), text                                                # schedule without duration


def test_a_broken_ec2nodeclass_is_refused(committed_plans, schemas_dir):
    nodeclass = copy.deepcopy(next(obj for _, obj in custom_resources(committed_plans["prod"]) if obj["kind"] == "EC2NodeClass"))
    assert validate(nodeclass).violations == []
    nodeclass["spec"]["instanceProfile"] = "some-profile"   # role and instanceProfile are exclusive
    nodeclass["spec"]["tags"] = {"karpenter.sh/nodepool": "x"}
    text = "\n".join(validate(nodeclass).violations)
    assert "has(self.role) && !has(self.instanceProfile)" in text
    assert "k != 'karpenter.sh/nodepool'" in text


def test_defaults_are_applied_before_the_rules(schemas_dir):
    schema = crd_schema("karpenter.sh", "NodePool", "v1")
    pool = apply_defaults({"spec": {"template": {"spec": {"requirements": [], "nodeClassRef": {
        "group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "x"}}}}}, schema)
    defaults = schema["properties"]["spec"]["properties"]["disruption"]
    assert "disruption" in pool["spec"] and pool["spec"]["disruption"] == apply_defaults(
        copy.deepcopy(defaults["default"]), defaults)
    assert validate({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "x"},
                     **pool}).violations == []


def test_a_rule_that_errors_at_run_time_rejects(schemas_dir):
    """A rule reading an absent field errors, which the API server reports as a rejection."""
    from policy.cel_eval import _evaluate

    ok, error = _evaluate("self.missing == 1", {})
    assert not ok and error.startswith("evaluation error")


# ------------------------------------------------------------------ transition rules (base -> head)


@pytest.mark.parametrize("stack", STACKS)
def test_transition_rules_hold_from_the_plan_to_itself(committed_plans, schemas_dir, stack):
    assert transition_failures(committed_plans[stack], committed_plans[stack]) == []
    pool = _nodepool(committed_plans[stack])
    # .spec (replicas), .spec.template.spec.nodeClassRef (group, kind): every NodePool transition rule.
    assert len(validate_update(pool, pool).evaluated) == 3


def test_a_nodepool_whose_node_class_kind_changes_is_refused_on_update(committed_plans, schemas_dir):
    base = committed_plans["dev"]
    head = copy.deepcopy(base)
    for r in head["resources"]:
        if r["type"].endswith(":NodePool"):
            r["inputs"]["spec"]["template"]["spec"]["nodeClassRef"]["kind"] = "OtherNodeClass"
            r["inputs"]["spec"]["replicas"] = 2
    failures = transition_failures(base, head)
    assert any("nodeClassRef" in f and "self.kind == oldSelf.kind" in f for f in failures), failures
    assert any("has(self.replicas) == has(oldSelf.replicas)" in f for f in failures), failures


def test_the_transitions_command_fails_on_a_forbidden_transition(committed_plans, schemas_dir, tmp_path, capsys):
    """What the PR plan-diff job runs: exit 1 and one line per violated rule; exit 0 on itself; exit 2
    (no traceback) on a file that is not a plan."""
    from policy.cel_eval import main

    base = committed_plans["dev"]
    head = copy.deepcopy(base)
    pool = next(r for r in head["resources"] if r["type"].endswith(":NodePool"))
    pool["inputs"]["spec"]["template"]["spec"]["nodeClassRef"]["kind"] = "OtherNodeClass"
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "head.json").write_text(json.dumps(head))
    assert main(["transitions", str(tmp_path / "base.json"), str(tmp_path / "base.json")]) == 0
    assert "0 violation(s)" in capsys.readouterr().out
    assert main(["transitions", str(tmp_path / "base.json"), str(tmp_path / "head.json")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"NodePool {pool['name']}.spec.template.spec.nodeClassRef: "
                      "nodeClassRef.kind is immutable (rule: self.kind == oldSelf.kind)"), out
    assert out[-1].startswith("CRD transition rules: 1 violation(s)")
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["transitions", str(tmp_path / "bad.json"), str(tmp_path / "head.json")]) == 2
    assert "is not a `ragpool plan --format json` document" in capsys.readouterr().err
