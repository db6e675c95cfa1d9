"""ragpool's IAM against the upstream reference policies it mirrors (infra/reference/).

Karpenter's controller policy, node role and interruption rules are compared with the
reference of the pinned Karpenter version, the EFS file system policy with
terraform-aws-modules/terraform-aws-efs. Policies come from the real program's plan
(tests/infra/iam_facts.py), reference placeholders are filled with the plan's values.

"Grants a reference statement" means: for every action and resource of the reference
statement, one ragpool statement with the same effect (and principal, for resource
policies) names the action (wildcards allowed), names a resource pattern covering the
reference's, and has conditions that are the same or narrower:
- Allow: every reference (operator, key) is present with values a subset of the
  reference's (extra conditions only narrow an Allow);
- Deny: every ragpool (operator, key) is one of the reference's with values a superset
  (fewer conditions only widen a Deny).
"Nothing beyond the reference" is the reverse: every (action, resource) ragpool allows
is allowed by some reference statement whose conditions ragpool's are the same as or
narrower than. Differences are allowed only through infra/reference/iam_deviations.yaml.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

import pytest
import yaml

from infra.charts import KARPENTER
from infra.config_schema import CAPACITY_TYPES
from infra.iam import NODE_ROLE_POLICIES
from tests.conftest import STACKS
from tests.infra.iam_eval import glob_match
from tests.infra.iam_facts import (EFS_REFERENCE, KARPENTER_REFERENCE, REFERENCE_DIR, PlannedIam, deviations,
                                   planned_iam, reference, substitute)

KINDS = {"omitted-statement", "omitted-actions", "omitted-trust", "omitted-rule"}
ROLE_POLICY_QUOTA = 10_240  # IAM quotas: inline policies of a role, characters without white space


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


class Stmt:
    """A statement in one shape, from a policy document or from reference facts."""

    def __init__(self, sid: str | None, effect: str, actions: Iterable[str], resources: Iterable[str],
                 conditions: dict[str, dict[str, Any]] | None, principal: Any = None):
        self.sid, self.effect, self.principal = sid, effect, principal
        self.actions, self.resources = list(actions), list(resources)
        self.conditions = {(op, key.lower()): frozenset(str(v) for v in _list(vals))
                           for op, entries in (conditions or {}).items() for key, vals in entries.items()}

    @classmethod
    def from_document(cls, st: dict[str, Any]) -> "Stmt":
        assert "NotAction" not in st and "NotResource" not in st, f"{st.get('Sid')}: NotAction/NotResource"
        return cls(st.get("Sid"), st["Effect"], _list(st["Action"]), _list(st["Resource"]), st.get("Condition"),
                   st.get("Principal"))

    @classmethod
    def from_reference(cls, fact: dict[str, Any]) -> "Stmt":
        return cls(fact["sid"], fact["effect"], fact["actions"], fact["resources"], fact["conditions"],
                   fact.get("principal"))


def _principal(p: Any) -> Any:
    if p is None:
        return None
    return {k: sorted(_list(v)) for k, v in p.items()} if isinstance(p, dict) else p


def _conditions_ok(ours: Stmt, ref: Stmt) -> bool:
    if ref.effect == "Allow":
        return all(k in ours.conditions and ours.conditions[k] <= v for k, v in ref.conditions.items())
    return all(k in ref.conditions and v >= ref.conditions[k] for k, v in ours.conditions.items())


def _grants(ours: Stmt, ref: Stmt, action: str, resource: str) -> bool:
    return (ours.effect == ref.effect and _principal(ours.principal) == _principal(ref.principal)
            and any(glob_match(a, action, ignore_case=True) for a in ours.actions)
            and any(glob_match(r, resource) for r in ours.resources)
            and _conditions_ok(ours, ref))


def missing_grants(ref: Stmt, ours: list[Stmt], actions: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(action, resource) pairs of ``ref`` that no statement of ``ours`` grants as the reference does."""
    return [(a, r) for a in (actions if actions is not None else ref.actions) for r in ref.resources
            if not any(_grants(s, ref, a, r) for s in ours)]


def beyond_reference(ours: list[Stmt], refs: list[Stmt]) -> list[str]:
    """What ``ours`` allows that no reference statement allows as broadly."""
    extra = []
    for s in ours:
        if s.effect != "Allow":
            continue
        for a in s.actions:
            for r in s.resources:
                if not any(ref.effect == "Allow" and any(glob_match(ra, a, ignore_case=True) for ra in ref.actions)
                           and any(glob_match(rr, r) for rr in ref.resources) and _conditions_ok(s, ref)
                           for ref in refs):
                    extra.append(f"{s.sid}: {a} on {r}")
    return extra


def _deviations(ref_name: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in deviations() if d["reference"] == ref_name and d["kind"] == kind]


def _omitted_statements(ref_name: str) -> set[str]:
    return {d["statement"] for d in _deviations(ref_name, "omitted-statement")}


def _omitted_actions(ref_name: str, sid: str) -> set[str]:
    return {a for d in _deviations(ref_name, "omitted-actions") if d["statement"] == sid for a in d["actions"]}


def karpenter_statements(iam: PlannedIam) -> dict[str, Stmt]:
    facts = substitute(reference(KARPENTER_REFERENCE)["policies"], iam.names())
    return {st["sid"]: Stmt.from_reference(st) for policy in facts.values() for st in policy}


def efs_statements(iam: PlannedIam) -> dict[str, Stmt]:
    facts = substitute(reference(EFS_REFERENCE)["statements"], iam.names())
    return {st["sid"]: Stmt.from_reference(st) for st in facts}


def _ours(document: dict[str, Any]) -> list[Stmt]:
    return [Stmt.from_document(st) for st in _list(document["Statement"])]


def _required(refs: dict[str, Stmt], ref_name: str) -> dict[str, tuple[Stmt, list[str]]]:
    omitted = _omitted_statements(ref_name)
    return {sid: (st, [a for a in st.actions if a not in _omitted_actions(ref_name, sid)])
            for sid, st in refs.items() if sid not in omitted}


@pytest.fixture(scope="module", params=STACKS)
def iam(request, committed_plans) -> PlannedIam:
    return planned_iam(request.param, committed_plans[request.param])


# ------------------------------------------------------------------ the reference itself


def test_karpenter_reference_is_the_pinned_version():
    source = reference(KARPENTER_REFERENCE)["source"]
    assert source["karpenter_version"] == KARPENTER.version, (
        f"infra/charts.py pins Karpenter {KARPENTER.version} but the reference policy records "
        f"{source['karpenter_version']}: record the reference of the pinned version")
    major_minor = ".".join(KARPENTER.version.split(".")[:2])
    assert f"/v{major_minor}/" in source["path"] and source["docs_version"] == f"v{major_minor}"
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"])


# ------------------------------------------------------------------ Karpenter controller policy


def test_controller_policy_grants_every_reference_statement(iam):
    ours = _ours(iam.controller_policy)
    missing = {sid: gaps for sid, (st, actions) in _required(karpenter_statements(iam), KARPENTER_REFERENCE).items()
               if (gaps := missing_grants(st, ours, actions))}
    assert not missing, (f"{iam.stack}: the controller policy does not grant these reference statements as "
                         f"upstream does (or list a deviation): {json.dumps(missing, indent=1)}")


def test_controller_policy_grants_nothing_beyond_the_reference(iam):
    refs = [st for sid, (st, _) in _required(karpenter_statements(iam), KARPENTER_REFERENCE).items()]
    extra = beyond_reference(_ours(iam.controller_policy), refs)
    assert not extra, f"{iam.stack}: the controller policy grants more than the reference: {extra}"


def test_controller_policy_fits_the_role_inline_policy_quota(iam):
    size = len(re.sub(r"\s", "", json.dumps(iam.controller_policy)))
    assert size <= ROLE_POLICY_QUOTA, f"{iam.stack}: controller policy is {size} characters (quota {ROLE_POLICY_QUOTA})"


# ------------------------------------------------------------------ EFS file system policy


def test_efs_policy_grants_every_reference_statement(iam):
    ours = _ours(iam.efs_policy)
    missing = {sid: gaps for sid, (st, actions) in _required(efs_statements(iam), EFS_REFERENCE).items()
               if (gaps := missing_grants(st, ours, actions))}
    assert not missing, f"{iam.stack}: the EFS file system policy lacks: {json.dumps(missing, indent=1)}"


def test_efs_policy_allows_nothing_beyond_the_reference(iam):
    refs = [st for st, _ in _required(efs_statements(iam), EFS_REFERENCE).values()]
    assert not beyond_reference(_ours(iam.efs_policy), refs)


def test_efs_policy_allows_what_the_csi_driver_needs(iam):
    client = reference(EFS_REFERENCE)["client"]
    allowed = {a for st in _ours(iam.efs_policy) if st.effect == "Allow" for a in st.actions}
    assert set(client["actions"]) <= allowed


# ------------------------------------------------------------------ node roles and interruption rules


def _node_roles(iam: PlannedIam) -> dict[str, dict[str, Any]]:
    """Roles EC2 instances assume (the system node group's and the GPU nodes')."""
    out = {}
    for r in iam.resources("aws:iam/role:Role"):
        trust = json.loads(r["inputs"]["assumeRolePolicy"])
        services = {s for st in trust["Statement"] for s in _list(st.get("Principal", {}).get("Service", []))}
        if "ec2.amazonaws.com" in services:
            out[iam.outputs(r)["name"]] = {"resource": r, "services": services}
    return out


def test_node_roles_match_the_reference_node_role(iam):
    ref = substitute(reference(KARPENTER_REFERENCE)["node_role"], iam.names())
    omitted = {d["service"] for d in _deviations(KARPENTER_REFERENCE, "omitted-trust")}
    expected_services = {t["principal_service"] for t in ref["trust"]} - omitted
    roles = _node_roles(iam)
    assert iam.node_role_arn.rsplit("/", 1)[1] in roles, "the EC2NodeClass role must be an EC2 node role"
    assert set(NODE_ROLE_POLICIES) == set(ref["managed_policies"])
    for name, role in roles.items():
        attached = {r["inputs"]["policyArn"].rsplit("/", 1)[1] for r in iam.resources(
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment") if r["inputs"]["role"] in (name, f"{name}-id")}
        assert attached == set(ref["managed_policies"]), f"{iam.stack}: {name} attaches {sorted(attached)}"
        assert role["services"] == expected_services, f"{iam.stack}: {name} trusts {sorted(role['services'])}"


def test_node_role_policies_have_one_home():
    """Both node roles come from infra/iam.py node_role: the policy list is written only there."""
    infra_dir = REFERENCE_DIR.parent
    for policy in NODE_ROLE_POLICIES:
        homes = sorted(str(p.relative_to(infra_dir)) for p in infra_dir.rglob("*.py") if f'"{policy}"' in p.read_text())
        assert homes == ["iam.py"], f"{policy} is declared in {homes}: use infra.iam.NODE_ROLE_POLICIES / node_role"


def _planned_rules(iam: PlannedIam) -> list[dict[str, Any]]:
    """Event patterns of the rules that feed Karpenter's interruption queue.

    (Under mocks a target's ``rule`` input is unknown, so rules are found through the
    component that owns the queue, and every one of its rules must target the queue.)
    """
    queue = [q for q in iam.resources("aws:sqs/queue:Queue") if iam.outputs(q)["arn"] == iam.queue_arn][0]
    rules = [r for r in iam.resources("aws:cloudwatch/eventRule:EventRule") if r["parent"] == queue["parent"]]
    targets = [t for t in iam.resources("aws:cloudwatch/eventTarget:EventTarget") if t["parent"] == queue["parent"]]
    assert len(targets) == len(rules) and all(t["inputs"]["arn"] == iam.queue_arn for t in targets)
    return [json.loads(r["inputs"]["eventPattern"]) for r in rules]


def test_interruption_rules_match_the_reference(iam):
    ref = reference(KARPENTER_REFERENCE)["interruption_rules"]
    omitted = {d["rule"] for d in _deviations(KARPENTER_REFERENCE, "omitted-rule")}
    expected = sorted((json.dumps(p, sort_keys=True) for name, p in ref.items() if name not in omitted))
    assert sorted(json.dumps(p, sort_keys=True) for p in _planned_rules(iam)) == expected


# ------------------------------------------------------------------ the deviations file


def test_every_deviation_is_explained_and_names_something_real():
    karpenter, efs = reference(KARPENTER_REFERENCE), reference(EFS_REFERENCE)
    sids = {KARPENTER_REFERENCE: {st["sid"]: st for p in karpenter["policies"].values() for st in p},
            EFS_REFERENCE: {st["sid"]: st for st in efs["statements"]}}
    for d in deviations():
        assert d["kind"] in KINDS, d
        assert len(d.get("reason", "").split()) >= 8, f"deviation without a real reason: {d}"
        assert d["reference"] in sids, d
        if d["kind"] in ("omitted-statement", "omitted-actions"):
            assert d["statement"] in sids[d["reference"]], d
        if d["kind"] == "omitted-actions":
            assert set(d["actions"]) <= set(sids[d["reference"]][d["statement"]]["actions"]), d
        if d["kind"] == "omitted-rule":
            assert d["rule"] in karpenter["interruption_rules"], d
        if d["kind"] == "omitted-trust":
            assert d["service"] in {t["principal_service"] for t in karpenter["node_role"]["trust"]}, d


def test_no_deviation_is_stale(iam):
    """Each listed deviation is still a difference: ragpool really leaves the thing out."""
    refs = {KARPENTER_REFERENCE: (karpenter_statements(iam), _ours(iam.controller_policy)),
            EFS_REFERENCE: (efs_statements(iam), _ours(iam.efs_policy))}
    for d in deviations():
        if d["kind"] in ("omitted-statement", "omitted-actions"):
            statements, ours = refs[d["reference"]]
            st = statements[d["statement"]]
            actions = st.actions if d["kind"] == "omitted-statement" else d["actions"]
            granted = [(a, r) for a in actions for r in st.resources if not missing_grants(st, ours, [a])]
            assert not granted, f"stale deviation (ragpool grants it now): {d}"
        elif d["kind"] == "omitted-trust":
            assert all(d["service"] not in role["services"] for role in _node_roles(iam).values()), d
        elif d["kind"] == "omitted-rule":
            pattern = reference(KARPENTER_REFERENCE)["interruption_rules"][d["rule"]]
            assert pattern not in _planned_rules(iam), f"stale deviation: {d}"


def _chart_default(schemas_dir, chart: str, version: str, path: str) -> Any:
    values = yaml.safe_load((schemas_dir / "helm" / chart / version / "values.yaml").read_text())
    for part in path.split("."):
        values = values[part]
    return values


def test_deviation_premises_hold(iam, schemas_dir):
    """The facts each deviation's reason rests on, checked against the plan and the pinned charts."""
    premises = {d["premise"] for d in deviations() if d.get("premise")}
    checked = set()

    # Karpenter never calls ARC zonal shift: settings.enableZonalShift is off.
    default = _chart_default(schemas_dir, "karpenter", KARPENTER.version, "settings.enableZonalShift")
    assert iam.karpenter_values.get("settings", {}).get("enableZonalShift", default) is False
    checked.add("karpenter-zonal-shift-off")

    # No pool launches into capacity reservations.
    assert "reserved" not in CAPACITY_TYPES
    for pool in iam.resources("kubernetes:karpenter.sh/v1:NodePool"):
        for req in pool["inputs"]["spec"]["template"]["spec"]["requirements"]:
            if req["key"] == "karpenter.sh/capacity-type":
                assert "reserved" not in req["values"], pool["name"]
    checked.add("no-reserved-capacity")

    # The EFS CSI controller never deletes access point root directories (needs ClientRootAccess).
    efs_version = sorted(p.name for p in (schemas_dir / "helm" / "aws-efs-csi-driver").iterdir())[-1]
    assert _chart_default(schemas_dir, "aws-efs-csi-driver", efs_version, "controller.deleteAccessPointRootDir") is False
    addon = [r for r in iam.resources("aws:eks/addon:Addon") if r["inputs"]["addonName"] == "aws-efs-csi-driver"]
    assert addon, "the EFS CSI driver add-on is not in the plan"
    config = json.loads(addon[0]["inputs"].get("configurationValues") or "{}")
    assert config.get("controller", {}).get("deleteAccessPointRootDir", False) is False
    checked.add("efs-csi-no-root-dir-delete")

    assert premises == checked, f"premises without a check here: {premises - checked}"
