"""lane-has-one-scaledjob: every lane that can hold a run has exactly one ScaledJob, on exactly its lists.

Each negative case starts from the committed plan (which passes) and breaks one thing.
"""

from __future__ import annotations

import copy

import pytest

from policy.checks import RULES_BY_NAME
from policy.offline import evaluate
from tests.conftest import STACKS
from tests.policy.conftest import find_all

pytestmark = pytest.mark.infra

RULE = "lane-has-one-scaledjob"
SCALED_JOB = "kubernetes:keda.sh/v1alpha1:ScaledJob"


def run(doc: dict) -> list[str]:
    return [v.message for v in evaluate(doc, None, rules=[RULES_BY_NAME[RULE]])]


def scaled_job(doc: dict, name: str) -> dict:
    [found] = [r for r in find_all(doc, SCALED_JOB) if r["inputs"]["metadata"]["name"] == name]
    return found


def env(resource: dict) -> dict[str, str]:
    container = resource["inputs"]["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container["env"]}


def test_rule_is_mandatory():
    assert RULES_BY_NAME[RULE].enforcement == "mandatory" and RULES_BY_NAME[RULE].scope == "stack"


@pytest.mark.parametrize("stack", STACKS)
def test_committed_stacks_have_one_scaledjob_per_lane(committed_plans, stack):
    assert run(committed_plans[stack]) == []


def test_a_missing_multi_node_scaledjob_leaves_its_lanes_uncovered(plan_of):
    doc = plan_of("dev")
    doc["resources"].remove(scaled_job(doc, "ragpool-worker-gpu-spot-n2"))
    messages = run(doc)
    assert len(messages) == 2, messages
    assert any("lane 'pool.gpu-spot.n2' in namespace 'ragpool-training'" in m and "none" in m for m in messages)
    assert any("lane 'torchrun.n2'" in m for m in messages)  # gpu-spot is dev's default pool


def test_a_missing_ray_scaledjob_is_seen(plan_of):
    doc = plan_of("prod")
    doc["resources"].remove(scaled_job(doc, "ragpool-worker-ray"))
    assert ["lane 'ray'" in m for m in run(doc)] == [True]


def test_two_scaledjobs_for_one_lane_fail(plan_of):
    doc = plan_of("prod")
    twin = copy.deepcopy(scaled_job(doc, "ragpool-worker-gpu-spot"))
    twin["name"] += "-twin"
    twin["inputs"]["metadata"]["name"] += "-twin"
    doc["resources"].append(twin)
    messages = run(doc)
    assert any("lane 'pool.gpu-spot'" in m and "2 (ragpool-worker-gpu-spot, ragpool-worker-gpu-spot-twin)" in m
               for m in messages), messages


def test_a_trigger_per_priority_is_required(plan_of):
    doc = plan_of("dev")
    job = scaled_job(doc, "ragpool-worker-gpu-spot-low")
    dropped = job["inputs"]["spec"]["triggers"].pop()["metadata"]["listName"]
    assert dropped == "ragpool:ready:low"  # the unpinned lane's list of the ScaledJob's priority
    [message] = run(doc)
    assert "ragpool-worker-gpu-spot-low: triggers on" in message
    assert message.count(f"'{dropped}'") == 1  # listed among the ready lists only, not among the triggers


def test_a_trigger_on_another_queue_fails(plan_of):
    doc = plan_of("dev")
    job = scaled_job(doc, "ragpool-worker-ray")
    job["inputs"]["spec"]["triggers"][0]["metadata"]["listName"] = "search:ready:high:ray"
    [message] = run(doc)
    assert "ragpool-worker-ray" in message and "'search:ready:high:ray'" in message and "queue 'ragpool'" in message


def test_triggers_must_be_summed(plan_of):
    doc = plan_of("dev")
    scaled_job(doc, "ragpool-worker-gpu-spot")["inputs"]["spec"]["scalingStrategy"]["multipleScalersCalculation"] = "max"
    [message] = run(doc)
    assert "multipleScalersCalculation is 'max'" in message


def test_a_worker_without_lanes_is_refused(plan_of):
    doc = plan_of("dev")
    job = scaled_job(doc, "ragpool-worker-gpu-spot-n8")
    container = job["inputs"]["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "RAGPOOL_LANES"]
    messages = run(doc)
    assert any("ragpool-worker-gpu-spot-n8: its worker names no valid RAGPOOL_LANES" in m for m in messages)
    assert any("lane 'pool.gpu-spot.n8'" in m for m in messages)  # and so its lanes have none


def test_a_larger_pool_needs_more_multi_node_lanes(plan_of):
    """Raising a pool's GPU limit without its ScaledJobs: the lanes it can now hold are uncovered."""
    doc = plan_of("dev")
    [pool] = [r for r in find_all(doc, "kubernetes:karpenter.sh/v1:NodePool")
              if r["inputs"]["spec"]["template"]["metadata"]["labels"]["ragpool.io/pool"] == "gpu-spot"]
    pool["inputs"]["spec"]["limits"]["nvidia.com/gpu"] = "9"
    assert run(doc) == []  # the namespace's GPU quota (8) still caps a gang at 8 pods
    [quota] = [r for r in find_all(doc, "kubernetes:core/v1:ResourceQuota")
               if r["inputs"]["metadata"]["namespace"] == "ragpool-training"
               and "requests.nvidia.com/gpu" in r["inputs"]["spec"]["hard"]]
    quota["inputs"]["spec"]["hard"]["requests.nvidia.com/gpu"] = "9"
    messages = run(doc)
    assert sorted(m.split("'")[1] for m in messages) == ["pool.gpu-spot.n9", "torchrun.n9"]


@pytest.fixture
def per_priority_dev(plan_of) -> dict:
    return plan_of("dev")  # the committed plans: a ScaledJob per (kind, priority)


def test_one_scaledjob_per_lane_and_priority_passes_and_a_missing_priority_is_seen(per_priority_dev):
    """With a ScaledJob per (kind, priority) (infra/keda.py PRIORITY_SCALED_JOBS) the dev stack passes every
    mandatory policy; without the low one of a lane, that lane's low runs have no worker."""
    assert [v.message for v in evaluate(per_priority_dev) if v.enforcement == "mandatory"] == []
    doc = copy.deepcopy(per_priority_dev)
    doc["resources"].remove(scaled_job(doc, "ragpool-worker-gpu-spot-low"))
    messages = run(doc)
    assert any("lane 'pool.gpu-spot'" in m and "can hold a low run but has none ScaledJobs" in m for m in messages)
    assert not any(" high run" in m or " normal run" in m for m in messages), messages
