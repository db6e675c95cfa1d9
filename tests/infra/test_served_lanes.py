"""The stack outputs ``ragpool submit`` checks a run against (training/scheduler/fit.py):

- ``servedLanes``: per training namespace (the main one and each team's), RAGPOOL_SERVED_LANES is exactly
  the set of lanes the namespace's KEDA ScaledJobs trigger on (read back from the ScaledJobs' ready-list
  triggers in the plan, not from infra/keda.py), so a run that passes the check has a worker that starts
  for it, and one refused would have waited forever;
- ``poolGpus``: RAGPOOL_POOL_GPUS (``pool=GPUS:<N>GiB:mem<M>GiB``), every GPU pool's worker GPUs and its smallest GPU
  memory from infra/reference/gpu_memory.yaml (AWS figures), unknown families left without memory (``pool=GPUS``).
"""

from __future__ import annotations

import pulumi
import pytest

from infra.config_schema import GPU_INSTANCE_FAMILIES
from infra.gpu_memory import REFERENCE, family_gpu_memory_gib, gpu_memory_gib
from infra.plan import render_plan, run_program
from infra.stack import load_stack
from tests.infra.harness import inputs_of
from contract.pool_gpus import PoolGpus, parse_pool_gpus
from training.scheduler.fit import lane_problems
from contract.lanes import SERVED_LANES_ENV, Lane, lane_of_ready_list, parse_lane_set
from training.scheduler.spec import parse_spec

# borrowingLimit 0: each team's lanes are what its nominal quota fits (borrowing widens them: test_kueue.py).
TEAMS = [{"name": "search", "gpuQuota": 4, "borrowingLimit": 0}, {"name": "small", "gpuQuota": 2, "borrowingLimit": 0}]
CASES = {"dev": None, "prod": None, "prod-teams": {"ragpool:trainingTeams": TEAMS}}


@pytest.fixture(scope="module")
def runs():
    """stack case -> (plan, stack outputs): the program run once under mocks, its exports captured."""
    out = {}
    real_export = pulumi.export
    try:
        for case, overrides in CASES.items():
            exported: dict = {}
            pulumi.export = lambda name, value, _into=exported: _into.__setitem__(name, value)
            settings = load_stack(case.split("-")[0], overrides=overrides)
            out[case] = (render_plan(settings, run_program(settings)), exported)
    finally:
        pulumi.export = real_export
    return out


def scaled_job_lanes(plan) -> dict[str, set[Lane]]:
    """Namespace -> the lanes its ScaledJobs trigger on (from each trigger's ready list)."""
    out: dict[str, set[Lane]] = {}
    for job in inputs_of(plan, "kubernetes:keda.sh/v1alpha1:ScaledJob"):
        lanes = out.setdefault(job["metadata"]["namespace"], set())
        for trigger in job["spec"]["triggers"]:
            queue, _, key = trigger["metadata"]["listName"].partition(":")
            found = lane_of_ready_list(key)
            assert found is not None, trigger["metadata"]["listName"]
            lanes.add(found[1])
    return out


@pytest.mark.parametrize("case", CASES)
def test_served_lanes_are_exactly_what_the_scaled_jobs_start_workers_for(runs, case):
    plan, exported = runs[case]
    served = {ns: set(parse_lane_set(text)) for ns, text in exported["servedLanes"].items()}
    assert served == scaled_job_lanes(plan)
    expected_namespaces = {"ragpool-training"} | ({"ragpool-team-search", "ragpool-team-small"}
                                                  if case == "prod-teams" else set())
    assert set(served) == expected_namespaces


def test_what_each_namespace_serves(runs):
    dev = set(parse_lane_set(runs["dev"][1]["servedLanes"]["ragpool-training"]))
    # dev: one pool (gpu-spot, gpuLimit 8, one GPU per worker), the default: single pods and gangs up to 8.
    assert dev == {Lane("ray"), *(Lane(nodes=n) for n in range(1, 9)), *(Lane(nodes=n, pool="gpu-spot") for n in range(1, 9))}
    teams = runs["prod-teams"][1]["servedLanes"]
    # A 4-GPU quota fits one 4-GPU gpu-spot worker, none of the default pool's 8-GPU workers; 2 GPUs fit none.
    assert set(parse_lane_set(teams["ragpool-team-search"])) == {Lane(pool="gpu-spot"), Lane("ray")}
    assert set(parse_lane_set(teams["ragpool-team-small"])) == {Lane("ray")}


@pytest.mark.parametrize("namespace, fields, key", [
    ("ragpool-team-search", {}, "pool"),  # unpinned: the default pool has no worker in the team's quota
    ("ragpool-team-search", {"pool": "gpu-spot"}, None),
    ("ragpool-team-search", {"pool": "gpu-spot", "nodes": 2}, "nodes"),
    ("ragpool-team-small", {"pool": "gpu-spot"}, "pool"),
    ("ragpool-team-small", {"executor": "ray"}, None),
    ("ragpool-training", {"nodes": 4}, None),
])
def test_submit_refuses_what_the_namespace_has_no_worker_for(runs, namespace, fields, key):
    value = runs["prod-teams"][1]["servedLanes"][namespace]
    spec = parse_spec({"run_id": "r", "stages": ["retriever"], **fields}, shared_root="/mnt/shared")
    problems = lane_problems(spec, {SERVED_LANES_ENV: value, "RAGPOOL_QUEUE_NAMESPACE": "search"})
    assert [k for k, _ in problems] == ([key] if key else [])
    if key:
        assert "namespace 'search'" in problems[0][1] and value.replace(",", ", ") in problems[0][1]


def test_pool_gpus(runs):
    # g5, g6: 24 GiB (not GPUSxGiB: x is nodes elsewhere); the worker pod's memory (tests/infra/test_gpu_memory.py)
    assert runs["dev"][1]["poolGpus"] == "gpu-spot=1:24GiB:mem11GiB"
    assert parse_pool_gpus(runs["dev"][1]["poolGpus"]) == {"gpu-spot": PoolGpus(1, 24.0, 11.0)}
    # prod: gpu-ondemand is p4d (40), gpu-ondemand-p5 p5 (80); g6e has no AWS figure recorded, so the
    # spot pool skips the GPU memory check (its pod memory is known: the host check is made).
    assert parse_pool_gpus(runs["prod"][1]["poolGpus"]) == {"gpu-ondemand": PoolGpus(8, 40.0, 1055.0),
                                                           "gpu-ondemand-p5": PoolGpus(8, 80.0, 1890.0),
                                                           "gpu-spot": PoolGpus(4, None, 167.0)}


def test_gpu_memory_reference_is_complete_and_sourced():
    import yaml

    doc = yaml.safe_load(REFERENCE.read_text())
    assert set(doc["families"]) <= set(GPU_INSTANCE_FAMILIES)
    for family, entry in doc["families"].items():
        assert entry["source"] in doc["sources"], family
        assert doc["sources"][entry["source"]]["url"].startswith(("https://docs.aws.amazon.com/", "https://docs.amazonaws.cn/",
                                                                   "https://aws.amazon.com/blogs/")), family
        assert entry["evidence"] and entry["per_gpu_gib"] > 0, family
    missing = set(GPU_INSTANCE_FAMILIES) - set(doc["families"])
    header = REFERENCE.read_text().split("sources:")[0]
    assert all(f in header for f in missing), f"say why these are not listed: {sorted(missing)}"
    assert family_gpu_memory_gib()["p5e"] == 141 and gpu_memory_gib("g5.48xlarge") == 24
    assert gpu_memory_gib("p4d.24xlarge") == 40 and gpu_memory_gib("g6e.12xlarge") is None
