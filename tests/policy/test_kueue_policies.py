"""kueue-quota-within-pools and scaledjob-kueue-managed (policy/checks/kueue.py) on the dev plan and on copies
broken one way each. A prod stack with three teams passes both: tests/infra/test_kueue.py."""

from __future__ import annotations

import copy

import pytest

from contract.names import KEDA_EXCLUDED_LABELS, KUEUE_QUEUE_LABEL
from policy.checks import RULES_BY_NAME
from policy.offline import evaluate

pytestmark = pytest.mark.infra

QUOTA_RULE, LABEL_RULE = "kueue-quota-within-pools", "scaledjob-kueue-managed"
CLUSTER_QUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"
SCALED_JOB = "kubernetes:keda.sh/v1alpha1:ScaledJob"


def run(doc: dict, rule: str) -> list[str]:
    return [v.message for v in evaluate(doc, None, rules=[RULES_BY_NAME[rule]])]


def resources(doc: dict, typ: str) -> list[dict]:
    return [r["inputs"] for r in doc["resources"] if r["type"] == typ]


@pytest.fixture
def dev(committed_plans) -> dict:
    return copy.deepcopy(committed_plans["dev"])


def test_rules_are_mandatory_stack_rules():
    for rule in (QUOTA_RULE, LABEL_RULE):
        assert RULES_BY_NAME[rule].enforcement == "mandatory" and RULES_BY_NAME[rule].scope == "stack"


def test_the_committed_plans_pass(committed_plans):
    for stack in ("dev", "prod"):
        assert run(committed_plans[stack], QUOTA_RULE) == [] and run(committed_plans[stack], LABEL_RULE) == []


def test_nominal_quota_above_the_pool_is_refused(dev):
    [queue] = resources(dev, CLUSTER_QUEUE)
    flavor = queue["spec"]["resourceGroups"][0]["flavors"][0]
    flavor["resources"][0]["nominalQuota"] = "9"  # dev's gpu-spot: gpuLimit 8 (a quantity string counts as well)
    messages = run(dev, QUOTA_RULE)
    assert any("on flavor 'gpu-spot' add up to 9, above pool 'gpu-spot''s gpuLimit 8" in m for m in messages), messages
    assert any("add up to 9, above the GPU pools' total gpuLimit 8" in m for m in messages), messages
    flavor["name"] = "gpu-elsewhere"
    assert any("flavor 'gpu-elsewhere', which is no ResourceFlavor of a GPU pool" in m for m in run(dev, QUOTA_RULE))


def test_a_scaled_job_whose_jobs_bypass_or_miss_the_queue_is_refused(dev):
    jobs = resources(dev, SCALED_JOB)
    del jobs[0]["metadata"]["labels"][KUEUE_QUEUE_LABEL]
    jobs[1]["metadata"]["labels"][KUEUE_QUEUE_LABEL] = "nowhere"
    jobs[2]["metadata"]["annotations"][KEDA_EXCLUDED_LABELS] += f",{KUEUE_QUEUE_LABEL}"
    messages = run(dev, LABEL_RULE)
    assert len(messages) == 3, messages
    assert f"no {KUEUE_QUEUE_LABEL} label, so the Jobs KEDA creates bypass Kueue" in messages[0]
    assert "is 'nowhere', but namespace 'ragpool-training' has no LocalQueue of that name (declared: ['ragpool'])" in messages[1]
    assert "so KEDA drops it from the Jobs it creates" in messages[2]


def test_a_single_priority_scaled_job_must_carry_its_workload_priority_class(dev):
    """A ScaledJob whose worker claims one priority (RAGPOOL_PRIORITIES) labels its Jobs with a declared
    WorkloadPriorityClass; one whose worker claims every priority carries none."""
    from contract.lanes import PRIORITIES_ENV
    from contract.names import KUEUE_PRIORITY_CLASS_LABEL

    jobs = {job["metadata"]["name"]: job for job in resources(dev, SCALED_JOB)}
    # The committed plans: a ScaledJob per (kind, priority), each claiming its priority under its class (passes).
    high, normal, low = (jobs[f"ragpool-worker-gpu-spot{suffix}"] for suffix in ("-high", "", "-low"))
    assert run(dev, LABEL_RULE) == []
    del high["metadata"]["labels"][KUEUE_PRIORITY_CLASS_LABEL]                   # claims high, no label
    container = normal["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != PRIORITIES_ENV]  # every priority, one label
    low["metadata"]["labels"][KUEUE_PRIORITY_CLASS_LABEL] = "ragpool-urgent"     # no such class
    messages = run(dev, LABEL_RULE)
    assert len(messages) == 3, messages

    def about(job: dict) -> str:
        [message] = [m for m in messages if f"ScaledJob ragpool-training/{job['metadata']['name']}:" in m]
        return message

    assert f"claim only high runs but its Jobs carry no {KUEUE_PRIORITY_CLASS_LABEL}" in about(high)
    assert "is 'ragpool-normal' but its workers claim runs of 3 priorities" in about(normal)
    assert "is 'ragpool-urgent', but no WorkloadPriorityClass of that name is declared" in about(low)
    low["metadata"]["labels"][KUEUE_PRIORITY_CLASS_LABEL] = "ragpool-low"
    assert len(run(dev, LABEL_RULE)) == 2
