"""Policy ray-token-auth: every RayCluster the program declares (and any a RayJob or RayService would
make) runs with Ray's token authentication; the same check offline and in the served CrossGuard pack.

Negative cases start from the real plans and break one thing, so a pass is never vacuous.
"""

from __future__ import annotations

import copy

import pytest

from policy.checks import MANDATORY, RULES_BY_NAME
from policy.offline import evaluate
from tests.conftest import STACKS
from tests.policy.conftest import find, find_all
from tests.support.kuberay import RAYCLUSTER
from tests.support.policy_pack import analyze

pytestmark = pytest.mark.infra

POLICY = "ray-token-auth"


def run(doc: dict) -> list:
    return evaluate(doc, None, rules=[RULES_BY_NAME[POLICY]])


def test_it_is_mandatory():
    assert RULES_BY_NAME[POLICY].enforcement == MANDATORY


@pytest.mark.parametrize("stack", STACKS)
def test_the_committed_stacks_pass(committed_plans, stack):
    assert find_all(committed_plans[stack], RAYCLUSTER)
    assert run(committed_plans[stack]) == []


def test_a_plan_with_team_namespaces_passes(team_plan):
    assert len(find_all(team_plan, RAYCLUSTER)) == 3
    assert run(team_plan) == []


@pytest.mark.parametrize(("auth", "found"), [
    (None, "spec.authOptions.mode is None"),
    ({"secretName": "ragpool-ray-auth"}, "spec.authOptions.mode is None"),  # KubeRay: empty mode is not token
    ({"mode": "disabled"}, "spec.authOptions.mode is 'disabled'"),
])
def test_a_raycluster_without_token_mode_fails(plan_of, auth, found):
    doc = plan_of("dev")
    cluster = find(doc, RAYCLUSTER)
    if auth is None:
        del cluster["inputs"]["spec"]["authOptions"]
    else:
        cluster["inputs"]["spec"]["authOptions"] = auth
    [v] = run(doc)
    assert (v.policy, v.enforcement, v.resource_type, v.resource_name) == (POLICY, MANDATORY, RAYCLUSTER,
                                                                           cluster["name"])
    assert found in v.message and "set authOptions {mode: token" in v.message


def test_kuberays_generated_secret_and_k8s_token_auth_count_as_token_auth(plan_of):
    doc = plan_of("dev")
    cluster = find(doc, RAYCLUSTER)
    cluster["inputs"]["spec"]["authOptions"] = {"mode": "token"}
    assert run(doc) == []
    cluster["inputs"]["spec"]["authOptions"] = {"mode": "token", "enableK8sTokenAuth": True}
    assert run(doc) == []


def test_a_container_switching_auth_off_or_carrying_the_token_fails(plan_of):
    doc = plan_of("prod")
    cluster = find(doc, RAYCLUSTER)
    spec = cluster["inputs"]["spec"]
    spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"].append({"name": "RAY_AUTH_MODE",
                                                                             "value": "disabled"})
    group = spec["workerGroupSpecs"][0]
    group["template"]["spec"]["containers"][0]["env"].append({"name": "RAY_AUTH_TOKEN", "value": "s3cr3t-token"})
    spec["autoscalerOptions"]["env"].append({"name": "RAY_AUTH_MODE", "value": "disabled"})
    messages = sorted(v.message for v in run(doc))
    assert len(messages) == 3, messages
    assert "spec autoscalerOptions sets RAY_AUTH_MODE='disabled'" in messages[0]
    assert "spec headGroupSpec container 'ray-head' sets RAY_AUTH_MODE='disabled'" in messages[1]
    assert (f"spec worker group {group['groupName']!r} container 'ray-worker' carries RAY_AUTH_TOKEN as a plain value"
            in messages[2])
    assert not any("s3cr3t-token" in m for m in messages)  # a finding never repeats the token
    # The token handed over from a Secret (what KubeRay itself does) is fine.
    group["template"]["spec"]["containers"][0]["env"][-1] = {
        "name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "ragpool-ray-auth", "key": "auth_token"}}}
    assert len(run(doc)) == 2


def test_rayjobs_and_rayservices_are_held_to_it_too(plan_of):
    doc = plan_of("dev")
    cluster = find(doc, RAYCLUSTER)
    spec = copy.deepcopy(cluster["inputs"]["spec"])
    del spec["authOptions"]
    job = {"type": "kubernetes:ray.io/v1:RayJob", "name": "a-rayjob",
           "inputs": {"metadata": {"name": "a-rayjob", "namespace": "ragpool-training"},
                      "spec": {"entrypoint": "python x.py", "rayClusterSpec": spec}}}
    service = {"type": "kubernetes:ray.io/v1:RayService", "name": "a-rayservice",
               "inputs": {"metadata": {"name": "a-rayservice", "namespace": "ragpool-training"},
                          "spec": {"rayClusterConfig": copy.deepcopy(spec)}}}
    on_existing = {"type": "kubernetes:ray.io/v1:RayJob", "name": "on-existing",
                   "inputs": {"metadata": {"name": "on-existing", "namespace": "ragpool-training"},
                              "spec": {"entrypoint": "python x.py", "clusterSelector": {"ray.io/cluster": "ragpool-ray"}}}}
    alpha = copy.deepcopy(cluster)
    alpha.update(type="kubernetes:ray.io/v1alpha1:RayCluster", name="alpha")  # v1alpha1 has no authOptions
    del alpha["inputs"]["spec"]["authOptions"]
    doc["resources"] += [job, service, on_existing, alpha]
    found = {(v.resource_name, v.message.split(" is ")[0]) for v in run(doc)}
    assert found == {("a-rayjob", "spec.rayClusterSpec.authOptions.mode"),
                     ("a-rayservice", "spec.rayClusterConfig.authOptions.mode"), ("alpha", "spec.authOptions.mode")}


def test_the_served_pack_blocks_a_raycluster_without_token_auth(analyzer, plan_of):
    from pulumi.runtime.proto import analyzer_pb2

    doc = plan_of("prod")
    cluster = find(doc, RAYCLUSTER)
    assert [d.policyName for d in analyze(analyzer, "prod", cluster).diagnostics] == []
    del cluster["inputs"]["spec"]["authOptions"]
    [d] = analyze(analyzer, "prod", cluster).diagnostics
    assert d.policyName == POLICY and d.enforcementLevel == analyzer_pb2.MANDATORY
    assert "spec.authOptions.mode is None" in d.message
