"""infra/keeper.py: one keeper per stack, in the main training namespace, keeping every queue; its probes ask the
paths the keeper serves, on the port it serves them (the plan's command run against a real redis-server)."""

from __future__ import annotations

import signal
import subprocess
import sys

from contract.env import NAMESPACES_ENV
from contract.paths import child_env
from contract.ports import free_port
from tests.support.probes import probe_codes
from tests.support.waits import wait_for
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
    assert env["REDIS_URL"]["valueFrom"]["configMapKeyRef"] == {"name": "ragpool-redis", "key": "url"}
    assert spec["template"]["metadata"]["labels"]["ragpool.io/redis-client"] == "true"
    assert {p["name"] for p in container["ports"]} == {"queue-metrics"}
    for doc in (team_plan, *committed_plans.values()):  # one keeper per stack, never in a team namespace
        assert len([d for d in inputs_of(doc, "kubernetes:apps/v1:Deployment") if d["metadata"]["name"] == KEEPER_NAME]) == 1


def test_the_keepers_probes_ask_what_the_keeper_serves(committed_plans, redis_server, namespace):
    [keeper] = [d for d in inputs_of(committed_plans["dev"], "kubernetes:apps/v1:Deployment", "ragpool-training")
                if d["metadata"]["name"] == KEEPER_NAME]
    container = keeper["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = {kind: container[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe")}
    assert {probe["port"] for probe in probes.values()} == {"queue-metrics"}
    # The plan's command, its metrics port moved to a free local one (the probes follow the named port).
    args = list(container["args"])
    args[args.index("--metrics-port") + 1] = str(port := free_port())
    assert int(container["args"][container["args"].index("--metrics-port") + 1]) == ports["queue-metrics"]
    proc = subprocess.Popen([sys.executable, *container["command"][1:], *args],
                            env=child_env(REDIS_URL=redis_server.url, **{NAMESPACES_ENV: namespace}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        codes = lambda: probe_codes(port, probes)  # noqa: E731
        wait_for(lambda: codes() == {"livenessProbe": 200, "readinessProbe": 200}, 30,
                 "the keeper's probe endpoints to answer 200", seen=codes, retry_on=(OSError,), poll_s=0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

