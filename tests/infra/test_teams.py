"""Per-team training namespaces: own quota, storage directory, queue and worker templates."""

from __future__ import annotations

import pytest

from infra.config import StackConfigError, parse
from infra.plan import plan
from tests.infra.harness import inputs_of, is_core, kubernetes_objects, validate_core, validate_custom

TEAMS = [{"name": "search", "gpuQuota": 4}, {"name": "answers", "gpuQuota": 3, "borrowingLimit": 0}]
# The namespace's GPU cap: what Kueue lets it reach (infra/kueue_objects.py reachable_gpus) on dev's 8 GPUs:
# search 4 + the 4 the others leave idle; answers may not borrow.
REACHABLE = {"search": 8, "answers": 3}


@pytest.fixture(scope="module")
def team_plan():
    return plan("dev", overrides={"ragpool:trainingTeams": TEAMS})


def _queue_namespaces(doc, ns: str) -> set[str]:
    """RAGPOOL_QUEUE_NAMESPACE of every worker template (one per pool and gang size, and the Ray
    worker) in ``ns``."""
    crons = inputs_of(doc, "kubernetes:batch/v1:CronJob", ns)
    assert crons, f"no worker templates in {ns}"
    return {e.get("value") for c in crons for e in c["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]
            if e["name"] == "RAGPOOL_QUEUE_NAMESPACE"}


def test_each_team_gets_an_isolated_namespace(team_plan):
    doc = team_plan
    for team in TEAMS:
        ns = f"ragpool-team-{team['name']}"
        namespace = [n for n in inputs_of(doc, "kubernetes:core/v1:Namespace") if n["metadata"]["name"] == ns]
        assert namespace and namespace[0]["metadata"]["labels"]["ragpool.io/training"] == "true"
        quota = inputs_of(doc, "kubernetes:core/v1:ResourceQuota", ns)[0]["spec"]["hard"]
        assert quota["requests.nvidia.com/gpu"] == str(REACHABLE[team["name"]])
        policies = {p["metadata"]["name"]: p["spec"] for p in inputs_of(doc, "kubernetes:networking.k8s.io/v1:NetworkPolicy", ns)}
        assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
        pvc = inputs_of(doc, "kubernetes:core/v1:PersistentVolumeClaim", ns)[0]
        assert pvc["spec"]["storageClassName"] == "ragpool-efs"  # its own EFS access point / directory
        # The queue's connection Secret (and the Ray token's, test_ray_cluster.py), each team its own.
        assert "ragpool-redis" in {s["metadata"]["name"] for s in inputs_of(doc, "kubernetes:core/v1:Secret", ns)}
        assert _queue_namespaces(doc, ns) == {team["name"]}
    assert _queue_namespaces(doc, "ragpool-training") == {"ragpool"}
    assert len(inputs_of(doc, "kubernetes:scheduling.k8s.io/v1:PriorityClass")) == 2  # cluster-wide, created once
    monitor = [m for m in inputs_of(doc, "kubernetes:monitoring.coreos.com/v1:PodMonitor")
               if m["metadata"]["name"] == "ragpool-training"][0]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [
        "ragpool-training", "ragpool-team-search", "ragpool-team-answers"]
    redis_policy = [p for p in inputs_of(doc, "kubernetes:networking.k8s.io/v1:NetworkPolicy", "ragpool-training")
                    if p["metadata"]["name"] == "ragpool-redis-clients-only"][0]
    peer = redis_policy["spec"]["ingress"][0]["from"][0]
    assert peer["namespaceSelector"] == {"matchLabels": {"ragpool.io/training": "true"}}


def test_team_objects_validate_and_pass_the_policies(team_plan, schemas_dir):
    from policy.offline import evaluate

    for _, obj in kubernetes_objects(team_plan):
        validate_core(obj, "1.35") if is_core(obj) else validate_custom(obj)
    mandatory = [v for v in evaluate(team_plan) if v.enforcement == "mandatory"]
    assert mandatory == []


@pytest.mark.parametrize("teams,fragment", [
    ([{"name": "a", "gpuQuota": 99}], "trainingTeams[0].gpuQuota"),
    ([{"name": "a", "gpuQuota": 1}, {"name": "a", "gpuQuota": 1}], "trainingTeams[1].name"),
    ([{"name": "A_b", "gpuQuota": 1}], "trainingTeams[0].name"),
    ([{"name": "a"}], "trainingTeams[0].gpuQuota"),
])
def test_bad_teams_are_named(teams, fragment):
    with pytest.raises(StackConfigError) as err:
        parse({"owner": "o", "costCenter": "c", "publicAccessCidrs": ["198.51.100.0/24"], "trainingTeams": teams},
              stack="dev", region="us-west-2")
    assert f"ragpool:{fragment}" in str(err.value)
