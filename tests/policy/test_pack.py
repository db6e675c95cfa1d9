"""The CrossGuard pack runs the same checks as the offline evaluator.

Three levels: the ``pulumi_policy`` objects from ``policy.pack.build_policies()`` called
with the SDK's own argument classes on every resource of both plans (same findings as
``evaluate``); the pack served over gRPC exactly as the Pulumi CLI starts it
(``python -m pulumi.policy <engine> policy``) and queried through the analyzer protocol;
and the pack's files (PulumiPolicy.yaml, pinned requirements).
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter

import pytest
import yaml

from policy.checks import RULES, stack_from_urn
from policy.offline import evaluate
from tests.conftest import STACKS
from tests.policy.conftest import REPO, find
from tests.support.policy_pack import analyze, to_struct, urn

pytestmark = pytest.mark.infra

POLICY_DIR = REPO / "policy"


def dependency_urns(stack: str, entry: dict) -> list[str]:
    """The plan's ``dependsOn`` ("type::name") as URNs, as the engine hands them to the pack."""
    return [urn(stack, dict(zip(("type", "name"), key.rsplit("::", 1)))) for key in entry.get("dependsOn", [])]


# ------------------------------------------------------------------ policy objects


def test_pack_policies_mirror_the_rules():
    from pulumi_policy import EnforcementLevel, ResourceValidationPolicy, StackValidationPolicy

    from policy.pack import build_policies

    policies = build_policies()
    assert [p.name for p in policies] == [r.name for r in RULES]
    for policy, rule in zip(policies, RULES):
        assert policy.enforcement_level == EnforcementLevel(rule.enforcement)
        expected = StackValidationPolicy if rule.scope == "stack" else ResourceValidationPolicy
        assert isinstance(policy, expected), policy.name
        assert policy.description == rule.description
        if rule.config_schema:
            assert set(policy.config_schema.properties) == set(rule.config_schema)


def _sdk_findings(doc: dict, stack: str) -> Counter:
    """Run every pack policy through the SDK's argument classes; count (policy, resource, message)."""
    from pulumi_policy import (
        PolicyCustomTimeouts,
        PolicyResource,
        PolicyResourceOptions,
        ResourceValidationArgs,
        ResourceValidationPolicy,
        StackValidationArgs,
    )
    from pulumi_policy.proxy import unknown_checking_proxy

    from policy.pack import build_policies

    def options(entry):
        return PolicyResourceOptions(bool(entry.get("protect")), [], None, [], PolicyCustomTimeouts(0, 0, 0), [])

    names_by_urn = {urn(stack, e): e["name"] for e in doc["resources"]}
    found: Counter = Counter()
    for policy in build_policies():
        if isinstance(policy, ResourceValidationPolicy):
            for entry in doc["resources"]:
                args = ResourceValidationArgs(entry["type"], unknown_checking_proxy(entry["inputs"]), urn(stack, entry),
                                              entry["name"], options(entry), None, {})
                policy.validate(args, lambda msg, _urn, n=entry["name"], p=policy.name: found.update([(p, n, msg)]))
        else:
            resources = [PolicyResource(e["type"], unknown_checking_proxy(e["inputs"]), urn(stack, e), e["name"],
                                        options(e), None, None, [], {}) for e in doc["resources"]]
            by_urn = {r.urn: r for r in resources}
            for r, e in zip(resources, doc["resources"]):
                r.dependencies = [by_urn[u] for u in dependency_urns(stack, e) if u in by_urn]
            policy.validate(StackValidationArgs(resources, {}),
                            lambda msg, u, p=policy.name: found.update([(p, names_by_urn.get(u), msg)]))
    return found


@pytest.mark.parametrize("stack", STACKS)
def test_sdk_policies_find_what_offline_finds(plan_of, stack):
    doc = plan_of(stack)
    # Break a few things so both sides have findings to agree on, not just silence.
    efs = find(doc, "aws:efs/fileSystem:FileSystem")
    efs["inputs"]["encrypted"] = False
    efs.pop("protect", None)
    del find(doc, "aws:kms/key:Key")["inputs"]["tags"]["owner"]
    doc["resources"] = [e for e in doc["resources"]
                        if not (e["type"] == "kubernetes:networking.k8s.io/v1:NetworkPolicy"
                                and e["inputs"]["metadata"]["name"] == "default-deny")]
    offline = Counter((v.policy, v.resource_name, v.message) for v in evaluate(doc))
    assert _sdk_findings(doc, stack) == offline
    policies = {p for p, _, _ in offline}
    assert {"efs-encrypted", "required-cost-tags", "training-namespace-default-deny"} <= policies
    assert ("prod-stateful-protected" in policies) == (stack == "prod")


def test_stack_name_comes_from_the_urn():
    assert stack_from_urn("urn:pulumi:prod::ragpool::aws:efs/fileSystem:FileSystem::storage-efs") == "prod"
    assert stack_from_urn("urn:pulumi:dev::ragpool::ragpool:infra:SharedStorage$aws:kms/key:Key::k") == "dev"
    assert stack_from_urn("not-a-urn") is None


# ------------------------------------------------------------------ the pack as the CLI runs it


def test_served_pack_reports_policies_and_levels(analyzer):
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import analyzer_pb2

    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
    assert info.name == "ragpool-guardrails"
    levels = {p.name: p.enforcementLevel for p in info.policies}
    assert list(levels) == [r.name for r in RULES]
    expected = {r.name: analyzer_pb2.MANDATORY if r.enforcement == "mandatory" else analyzer_pb2.ADVISORY
                for r in RULES}
    assert levels == expected


def test_served_pack_passes_every_committed_resource(analyzer, committed_plans):
    from pulumi.runtime.proto import analyzer_pb2

    for stack in STACKS:
        doc = committed_plans[stack]
        mandatory = []
        for entry in doc["resources"]:
            for d in analyze(analyzer, stack, entry).diagnostics:
                if d.enforcementLevel == analyzer_pb2.MANDATORY:
                    mandatory.append(f"{entry['name']}: {d.policyName}: {d.message}")
        assert mandatory == [], "\n".join(mandatory)
        stack_request = analyzer_pb2.AnalyzeStackRequest(resources=[
            analyzer_pb2.AnalyzerResource(type=e["type"], name=e["name"], urn=urn(stack, e),
                                          properties=to_struct(e["inputs"]), dependencies=dependency_urns(stack, e))
            for e in doc["resources"]])
        assert list(analyzer.AnalyzeStack(stack_request, timeout=60).diagnostics) == []


def test_served_pack_blocks_violations(analyzer, plan_of):
    from pulumi.runtime.proto import analyzer_pb2

    doc = plan_of("prod")
    efs = find(doc, "aws:efs/fileSystem:FileSystem")
    efs["inputs"]["encrypted"] = False
    efs["protect"] = False
    diagnostics = {d.policyName: d for d in analyze(analyzer, "prod", efs).diagnostics}
    assert set(diagnostics) == {"efs-encrypted", "prod-stateful-protected"}
    assert diagnostics["efs-encrypted"].enforcementLevel == analyzer_pb2.MANDATORY
    assert "encrypted is False" in diagnostics["efs-encrypted"].message

    # Counts arrive as floats over the wire; the checks must still read them as counts.
    worker = find(doc, "kubernetes:batch/v1:CronJob")
    container = worker["inputs"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["runAsUser"] = 0
    container["resources"] = {"limits": {"memory": "1Gi", "nvidia.com/gpu": 8}, "requests": {"nvidia.com/gpu": 8}}
    [d] = analyze(analyzer, "prod", worker).diagnostics
    assert d.policyName == "training-containers-nonroot-limits" and "runAsUser is 0" in d.message

    # The keeper before the round-4 fix: its 0440 password file stays root's without fsGroup (modes and
    # uids arrive as floats too).
    keeper = next(e for e in doc["resources"] if e["type"] == "kubernetes:apps/v1:Deployment"
                  and e["inputs"]["metadata"]["name"] == "ragpool-queue-keeper")
    del keeper["inputs"]["spec"]["template"]["spec"]["securityContext"]["fsGroup"]
    [d] = analyze(analyzer, "prod", keeper).diagnostics
    assert d.policyName == "secret-volumes-readable" and d.enforcementLevel == analyzer_pb2.MANDATORY
    assert "container 'keeper' (uid 10001, groups [10001]) cannot read Secret volume 'redis'" in d.message


def test_served_pack_reports_unknown_values_as_advisory(analyzer, plan_of):
    from pulumi.runtime.proto import analyzer_pb2
    from pulumi_policy.proxy import UNKNOWN_BOOLEAN_VALUE

    doc = plan_of("dev")
    efs = find(doc, "aws:efs/fileSystem:FileSystem")
    efs["inputs"]["encrypted"] = UNKNOWN_BOOLEAN_VALUE
    [d] = analyze(analyzer, "dev", efs).diagnostics
    assert d.policyName == "efs-encrypted" and d.enforcementLevel == analyzer_pb2.ADVISORY
    assert "can't run policy 'efs-encrypted'" in d.message


def test_served_pack_stack_policy_names_the_namespace(analyzer, plan_of):
    from pulumi.runtime.proto import analyzer_pb2

    doc = plan_of("dev")
    resources = [e for e in doc["resources"] if not (
        e["type"] == "kubernetes:networking.k8s.io/v1:NetworkPolicy" and e["inputs"]["metadata"]["name"] == "default-deny")]
    request = analyzer_pb2.AnalyzeStackRequest(resources=[
        analyzer_pb2.AnalyzerResource(type=e["type"], name=e["name"], urn=urn("dev", e), properties=to_struct(e["inputs"]),
                                      dependencies=dependency_urns("dev", e))
        for e in resources])
    [d] = analyzer.AnalyzeStack(request, timeout=60).diagnostics
    assert d.policyName == "training-namespace-default-deny"
    assert d.urn == urn("dev", find(doc, "kubernetes:core/v1:Namespace", "training-ns"))


# ------------------------------------------------------------------ pack files


def test_policy_project_file_points_at_the_repo_virtualenv():
    project = yaml.safe_load((POLICY_DIR / "PulumiPolicy.yaml").read_text())
    assert project["runtime"]["name"] == "python"
    venv = (POLICY_DIR / project["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == REPO / ".venv"
    assert re.fullmatch(r"\d+\.\d+\.\d+", str(project["version"]))


def test_pack_requirements_match_pyproject_pins():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = {}
    for spec in [*pyproject["project"]["dependencies"],
                 *(s for extra in pyproject["project"]["optional-dependencies"].values() for s in extra)]:
        name, _, version = spec.partition("==")
        pins[name.strip().lower()] = version.strip()
    lines = [ln.strip() for ln in (POLICY_DIR / "requirements.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines, "policy/requirements.txt lists no packages"
    for line in lines:
        name, sep, version = line.partition("==")
        assert sep, f"policy/requirements.txt: {line!r} is not pinned with =="
        assert pins.get(name.lower()) == version, f"{name}=={version} differs from pyproject ({pins.get(name.lower())})"


def test_served_pack_sees_the_provider_dependency(analyzer, plan_of):
    """CrossGuard hands stack policies the engine's dependencies: drop the provider's and it is refused."""
    from pulumi.runtime.proto import analyzer_pb2

    doc = plan_of("prod")
    provider = find(doc, "pulumi:providers:kubernetes")
    provider["dependsOn"] = [d for d in provider["dependsOn"] if "AccessPolicyAssociation" not in d]
    request = analyzer_pb2.AnalyzeStackRequest(resources=[
        analyzer_pb2.AnalyzerResource(type=e["type"], name=e["name"], urn=urn("prod", e), properties=to_struct(e["inputs"]),
                                      dependencies=dependency_urns("prod", e))
        for e in doc["resources"]])
    [d] = analyzer.AnalyzeStack(request, timeout=60).diagnostics
    assert d.policyName == "k8s-provider-waits-for-access" and d.urn == urn("prod", provider)
