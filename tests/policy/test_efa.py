"""efa-pool-requests-devices (round-4 audit, item 4): every GPU worker template of an EFA pool requests its share
of the node's EFA devices, limits = requests; no template of another pool requests any.

Fails on the code before EFA: prod's gpu-ondemand (p4d.24xlarge, p5.48xlarge) templates requested no
vpc.amazonaws.com/efa, so Karpenter attached no interface and the gangs trained over TCP (shown below by removing
the request from one template). A NodePool that may launch types giving a worker different counts (p4d.24xlarge 4,
p5.48xlarge 32, as prod's pool did before its split) fails whatever its templates request."""

from __future__ import annotations

import json

import pytest

from contract.names import EFA_RESOURCE, POOL_LABEL
from policy.checks import RULES_BY_NAME
from policy.offline import evaluate
from tests.support.kuberay import RAYCLUSTER

pytestmark = pytest.mark.infra

RULE = "efa-pool-requests-devices"
SCALED_JOB = "kubernetes:keda.sh/v1alpha1:ScaledJob"
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
CRONJOB = "kubernetes:batch/v1:CronJob"


def run(doc: dict) -> list:
    return evaluate(doc, None, rules=[RULES_BY_NAME[RULE]])


def scaled_jobs(doc: dict, pool: str) -> list[dict]:
    return [r for r in doc["resources"] if r["type"] == SCALED_JOB
            and r["inputs"]["spec"]["jobTargetRef"]["template"]["spec"]["nodeSelector"].get(POOL_LABEL) == pool]


def worker(resource: dict) -> dict:
    return resource["inputs"]["spec"]["jobTargetRef"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_committed_stacks_pass(committed_plans, stack):
    assert run(committed_plans[stack]) == []


def test_an_efa_pool_gang_without_the_request_is_refused(plan_of):
    doc = plan_of("prod")
    gang = next(r for r in scaled_jobs(doc, "gpu-ondemand") if r["inputs"]["metadata"]["name"].endswith("-n2"))
    for side in ("requests", "limits"):
        del worker(gang)["resources"][side][EFA_RESOURCE]
    [v] = run(doc)
    assert v.resource_name == gang["name"] and "requests vpc.amazonaws.com/efa None" in v.message
    assert "gives a worker 4 EFA device(s)" in v.message


def test_fewer_devices_than_the_pool_gives_or_a_limit_unlike_the_request_is_refused(plan_of):
    doc = plan_of("prod")
    first, second = scaled_jobs(doc, "gpu-ondemand")[:2]
    worker(first)["resources"]["requests"][EFA_RESOURCE] = worker(first)["resources"]["limits"][EFA_RESOURCE] = "1"
    worker(second)["resources"]["limits"][EFA_RESOURCE] = "2"
    assert {v.resource_name for v in run(doc)} == {first["name"], second["name"]}


def test_a_pool_without_an_efa_share_must_not_request_one(plan_of):
    doc = plan_of("prod")
    spot = scaled_jobs(doc, "gpu-spot")[0]
    worker(spot)["resources"]["requests"][EFA_RESOURCE] = worker(spot)["resources"]["limits"][EFA_RESOURCE] = "1"
    [v] = run(doc)
    assert v.resource_name == spot["name"] and "drop the vpc.amazonaws.com/efa request" in v.message


def test_prod_with_three_teams_passes(three_teams):
    """Every team namespace's worker templates and Ray workers of the EFA pool request the share too."""
    doc = three_teams
    teams = {r["inputs"]["metadata"]["namespace"] for r in doc["resources"] if r["type"] == SCALED_JOB
             and EFA_RESOURCE in worker(r)["resources"]["limits"]}
    assert {"ragpool-training", "ragpool-team-search", "ragpool-team-answers"} <= teams
    assert run(doc) == []



def instance_types(doc: dict, pool: str) -> list[str]:
    """The (mutable) instance-type requirement values of ``pool``'s NodePool."""
    [node_pool] = [r for r in doc["resources"] if r["type"] == NODEPOOL and r["inputs"]["metadata"]["name"] == pool]
    [req] = [q for q in node_pool["inputs"]["spec"]["template"]["spec"]["requirements"]
             if q["key"] == "node.kubernetes.io/instance-type"]
    return req["values"]


def test_prod_passes_with_p5_workers_asking_32_and_p4d_workers_4(plan_of):
    doc = plan_of("prod")
    assert instance_types(doc, "gpu-ondemand") == ["p4d.24xlarge"] and instance_types(doc, "gpu-ondemand-p5") == ["p5.48xlarge"]
    for pool, devices in (("gpu-ondemand", "4"), ("gpu-ondemand-p5", "32")):
        assert {worker(r)["resources"]["limits"][EFA_RESOURCE] for r in scaled_jobs(doc, pool)} == {devices}
    assert run(doc) == []


def test_a_nodepool_whose_types_give_different_counts_fails_every_template_of_it(plan_of):
    """A hand-made plan as prod was: p4d and p5 in one NodePool, workers asking 4. Every GPU template of the pool
    fails (4 leaves 28 of a p5's interfaces idle; 32 could not be had on a p4d); the other pools pass."""
    doc = plan_of("prod")
    instance_types(doc, "gpu-ondemand").append("p5.48xlarge")
    violations = run(doc)
    pinned = {r["name"] for r in doc["resources"] if r["type"] in (SCALED_JOB, CRONJOB, RAYCLUSTER)
              and json.dumps({POOL_LABEL: "gpu-ondemand"})[1:-1] in json.dumps(r["inputs"])}
    assert len(pinned) == 17  # the 1- to 4-node ScaledJobs (one per priority) and CronJobs, the RayCluster
    assert {v.resource_name for v in violations} == pinned
    assert all("p4d.24xlarge 4, p5.48xlarge 32" in v.message and "split the pool" in v.message for v in violations)


def test_workers_asking_fewer_than_every_type_of_their_nodepool_fail(plan_of):
    """The p5 NodePool's pods asking 4, as the mixed pool's did: Karpenter attaches 32 and 28 sit idle."""
    doc = plan_of("prod")
    gangs = scaled_jobs(doc, "gpu-ondemand-p5")
    for gang in gangs:
        worker(gang)["resources"]["requests"][EFA_RESOURCE] = worker(gang)["resources"]["limits"][EFA_RESOURCE] = "4"
    violations = run(doc)
    assert {v.resource_name for v in violations} == {g["name"] for g in gangs}
    assert all("gives a worker 32 EFA device(s)" in v.message for v in violations)
