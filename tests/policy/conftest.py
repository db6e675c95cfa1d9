from __future__ import annotations

import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

THREE_TEAMS = [{"name": "search", "gpuQuota": 8}, {"name": "answers", "gpuQuota": 16}, {"name": "evals", "gpuQuota": 4}]
"""The training teams of ``three_teams``: three team namespaces beside the main one."""


@pytest.fixture(scope="session")
def three_teams(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict:
    """Prod with ``THREE_TEAMS``, its spot pool run one GPU per worker: 16 lanes of it (a gang of up to 16 pods),
    so the main namespace has 23 ScaledJobs (with the p4d pool's 4, the p5 pool's 2 and the Ray worker). Built once
    per run (``once_per_run``: under xdist the first worker builds it, the others read its JSON) for the policy
    modules that read it (test_jobs_quota.py, test_efa.py). Never mutate it: deep-copy it first."""
    import copy
    import json

    from infra.plan import plan
    from infra.stack import load_stack
    from tests.support.once import once_per_run

    def build(out: Path) -> None:
        pools = copy.deepcopy(load_stack("prod").raw["gpuPools"])
        [spot] = [p for p in pools if p["name"] == "gpu-spot"]
        spot["gpusPerWorker"] = 1
        doc = plan("prod", overrides={"ragpool:trainingTeams": THREE_TEAMS, "ragpool:gpuPools": pools})
        (out / "plan.json").write_text(json.dumps(doc))

    # Plain JSON values: what plan() returns.
    return json.loads((once_per_run(tmp_path_factory, worker_id, "three_teams", build) / "plan.json").read_text())


def find(doc: dict, rtype: str, name: str | None = None) -> dict[str, Any]:
    """The first resource of a type (and name) in a plan document; fails the test if absent."""
    for entry in doc["resources"]:
        if entry["type"] == rtype and (name is None or entry["name"] == name):
            return entry
    raise AssertionError(f"plan {doc['stack']} has no {rtype} {name or ''}")


def find_all(doc: dict, rtype: str) -> list[dict[str, Any]]:
    found = [e for e in doc["resources"] if e["type"] == rtype]
    assert found, f"plan {doc['stack']} has no {rtype}"
    return found


@pytest.fixture(scope="module")
def analyzer():
    """The pack served by `python -m pulumi.policy <engine> policy` (what the CLI runs); query it with
    tests/support/policy_pack.py. Module scope: one served pack per module that uses it."""
    import grpc
    from pulumi.runtime.proto import analyzer_pb2_grpc

    proc = subprocess.Popen([sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", "policy"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while not line and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline().strip()
        if not line.isdigit():
            proc.kill()
            pytest.fail(f"policy pack did not print its port (got {line!r}): {proc.stderr.read()[-2000:]}")
        channel = grpc.insecure_channel(f"127.0.0.1:{line}")
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)
