"""infra/keeper.py: one keeper per stack, in the main training namespace, keeping every queue."""

from __future__ import annotations

from contract.env import NAMESPACES_ENV
from infra.keeper import KEEPER_NAME
from tests.conftest import TEAMS_ON_PROD
from tests.infra.harness import inputs_of


def test_one_keeper_for_every_queue(team_plan, committed_plans):
    """The prod plan with two teams (the session's ``team_plan``): the main queue's keeper keeps the teams' too."""
    [keeper] = [d for d in inputs_of(team_plan, "kubernetes:apps/v1:Deployment", "ragpool-training")
                if d["metadata"]["name"] == KEEPER_NAME]
    spec = keeper["spec"]
    assert spec["replicas"] == 1
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"ragpool.io/pool": "system"} and "tolerations" not in pod
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "training.scheduler.keeper"]
    assert "--interval-seconds" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env[NAMESPACES_ENV]["value"] == ",".join(["ragpool", *(team["name"] for team in TEAMS_ON_PROD)])
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ragpool-redis", "key": "url"}
    assert spec["template"]["metadata"]["labels"]["ragpool.io/redis-client"] == "true"
    assert {p["name"] for p in container["ports"]} == {"queue-metrics"}
    for doc in (team_plan, *committed_plans.values()):  # one keeper per stack, never in a team namespace
        assert len([d for d in inputs_of(doc, "kubernetes:apps/v1:Deployment") if d["metadata"]["name"] == KEEPER_NAME]) == 1
