"""RAGPOOL_RAY_POOLS as the plan sets it: what ``ragpool submit`` and the Ray worker check a ray run
against is exactly what each namespace's RayCluster can place (a pool it can scale, with the GPUs of
one of its Ray workers), so a run that passes the check has a worker group to land on and one that
asks for more is refused before it waits forever."""

from __future__ import annotations

import pytest

from infra.plan import plan
from tests.infra.harness import inputs_of
from contract.ray_pools import POOLS_ENV, format_pools, parse_pools, pool_problems
from training.scheduler.spec import RunSpec, SpecError, parse_spec

TEAMS = [{"name": "search", "gpuQuota": 4}, {"name": "small", "gpuQuota": 2}]


@pytest.fixture(scope="module")
def team_plan():
    return plan("prod", overrides={"ragpool:trainingTeams": TEAMS})


def template_pools(doc) -> dict[str, dict[str, int]]:
    """Namespace -> the pools its Ray worker template declares."""
    out = {}
    for cron in inputs_of(doc, "kubernetes:batch/v1:CronJob"):
        if cron["metadata"]["name"] == "ragpool-worker-ray":
            container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e.get("value") for e in container["env"]}
            out[cron["metadata"]["namespace"]] = parse_pools(env[POOLS_ENV])
    return out


def cluster_pools(doc) -> dict[str, dict[str, int]]:
    """Namespace -> pool -> GPUs of one Ray worker, for the worker groups that may scale above 0."""
    out = {}
    for cluster in inputs_of(doc, "kubernetes:ray.io/v1:RayCluster"):
        out[cluster["metadata"]["namespace"]] = {
            g["groupName"]: int(g["resources"]["GPU"]) for g in cluster["spec"]["workerGroupSpecs"]
            if g["maxReplicas"] > 0}
    return out


def test_each_ray_worker_declares_exactly_what_its_cluster_can_place(team_plan):
    declared, placeable = template_pools(team_plan), cluster_pools(team_plan)
    assert set(declared) == {"ragpool-training", "ragpool-team-search", "ragpool-team-small"}
    assert declared == placeable
    assert declared["ragpool-training"] == {"gpu-ondemand": 8, "gpu-spot": 4, "gpu-ondemand-p5": 8}
    # A 4-GPU quota cannot hold one 8-GPU worker; a 2-GPU quota holds no worker of either pool.
    assert declared["ragpool-team-search"] == {"gpu-spot": 4} and declared["ragpool-team-small"] == {}


def ray_run(pool: str, gpus: int):
    return parse_spec({"run_id": "r", "stages": ["retriever"], "executor": "ray",
                       "hyperparameters": {"run": {"ray.retriever.pool": pool, "ray.retriever.gpus": gpus}}},
                      shared_root="/mnt/shared")


@pytest.mark.parametrize("namespace, pool, gpus, key", [
    ("ragpool-training", "gpu-ondemand", 8, None),
    ("ragpool-training", "gpu-ondemand", 9, "ray.retriever.gpus"),
    ("ragpool-team-search", "gpu-spot", 4, None),
    ("ragpool-team-search", "gpu-ondemand", 1, "ray.retriever.pool"),
    ("ragpool-team-small", "gpu-spot", 1, "ray.retriever.pool"),
])
def test_submit_and_the_ray_worker_refuse_what_the_namespace_cannot_place(team_plan, monkeypatch,
                                                                          namespace, pool, gpus, key):
    pools = template_pools(team_plan)[namespace]
    assert [k for k, _ in pool_problems({"retriever": (pool, gpus)}, pools)] == ([key] if key else [])
    # Submitted where RAGPOOL_RAY_POOLS was stale (bigger pools than this namespace has) ...
    monkeypatch.setenv(POOLS_ENV, "gpu-ondemand=16,gpu-spot=16")
    spec = ray_run(pool, gpus)
    # ... the namespace's Ray worker, whose template carries the real list, refuses it when it validates
    # the claimed spec, once, against its own environment (training/scheduler/worker/ run_task).
    monkeypatch.setenv(POOLS_ENV, format_pools(pools))
    if key is None:
        assert RunSpec.from_json(spec.to_json(), shared_root="/mnt/shared") == spec
    else:
        with pytest.raises(SpecError) as refused:
            RunSpec.from_json(spec.to_json(), shared_root="/mnt/shared")
        assert f"hyperparameters.run.{key}" in str(refused.value) and namespace not in str(refused.value)


def test_pools_text_round_trips():
    assert parse_pools(format_pools({"b": 8, "a": 1})) == {"a": 1, "b": 8}
    assert format_pools({}) == "" and parse_pools("") == {}
