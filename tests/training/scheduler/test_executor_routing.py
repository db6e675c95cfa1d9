"""Runs go to the workers of their executor (real redis-server): a GPU worker (``RAGPOOL_EXECUTORS``
torchrun) never claims a ray run, the Ray template's CPU worker (ray) never claims a torchrun run,
and a run keeps its lane through every way back to the queue."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from tests.support.redis_fixtures import make_spec
from contract.paths import child_env

from contract import exit_codes
from contract.lanes import RAY_LANE
from training.scheduler.run_queue import lane
from training.scheduler.spec import SpecError, parse_spec
from contract.env import EXECUTORS_ENV
from training.scheduler.worker.settings import WorkerConfig

GPU, RAY = ("torchrun",), ("ray",)


def ray_spec(run_id: str, **fields):
    return make_spec(run_id, executor="ray", **fields)


def test_each_worker_claims_only_its_executors_runs(make_queue):
    q = make_queue()
    q.submit(ray_spec("r-high", priority="high"))
    q.submit(make_spec("t-normal"))
    q.submit(make_spec("t-two-nodes", nodes=2))
    q.submit(ray_spec("r-low", priority="low"))
    assert q.stats().depth == {"high": 1, "normal": 2, "low": 1}

    assert q.claim("gpu", executors=GPU).task_id == "t-normal", "the high ray run is not a GPU worker's"
    assert q.claim("gpu", executors=GPU) is None, "nor is the low one; the 2-node run needs a 2-node Job"
    assert q.claim("ray", executors=RAY).task_id == "r-high"
    assert q.claim("indexed", nodes=2, executors=GPU).task_id == "t-two-nodes"
    assert q.claim("ray", executors=RAY).task_id == "r-low"
    assert q.claim("ray", executors=RAY) is None
    assert q.stats().depth == {"high": 0, "normal": 0, "low": 0}


def test_a_worker_of_both_executors_takes_the_highest_priority_first(make_queue):
    q = make_queue()
    q.submit(make_spec("t-normal"))
    q.submit(ray_spec("r-high", priority="high"))
    q.submit(ray_spec("r-normal"))
    both = ("torchrun", "ray")
    order = [q.claim("both", executors=both).task_id for _ in range(3)]
    assert order == ["r-high", "t-normal", "r-normal"], "priority first, then the worker's lane order"


def test_a_dedicated_claim_by_run_id_respects_the_lane(make_queue):
    q = make_queue()
    q.submit(ray_spec("r-only"))
    assert q.claim("gpu", run_id="r-only", executors=GPU) is None
    assert q.get("r-only").state == "queued", "a refused dedicated claim leaves the run waiting"
    assert q.claim("ray", run_id="r-only", executors=RAY).task_id == "r-only"


def test_a_ray_run_stays_in_its_lane_through_lease_loss_retry_and_dead_letter(make_queue):
    q = make_queue(lease_seconds=0.2, backoff_base_s=0.01, backoff_max_s=0.01)
    q.submit(ray_spec("r-back", max_attempts=2))
    first = q.claim("ray-1", executors=RAY)
    time.sleep(0.3)  # lease expired: the next claim reaps it back to the ray lane
    assert q.claim("gpu", executors=GPU) is None
    second = q.claim("ray-2", executors=RAY)
    assert second.task_id == "r-back" and second.attempt == 2 and not q.ack(first)
    assert q.fail(second, "RayTaskError: boom") == "dead"
    assert q.retry("r-back") == "requeued"
    assert q.claim("gpu", executors=GPU) is None
    third = q.claim("ray-3", executors=RAY)
    assert third.task_id == "r-back"
    assert q.release(third) == "released"
    assert q.claim("gpu", executors=GPU) is None and q.claim("ray-4", executors=RAY).task_id == "r-back"


def test_ack_and_claim_next_stays_in_the_workers_lanes(make_queue):
    q = make_queue()
    q.submit(make_spec("t-1"))
    q.submit(ray_spec("r-1"))
    q.submit(make_spec("t-2"))
    first = q.claim("gpu", executors=GPU)
    acked, nxt = q.ack_and_claim(first, "gpu", executors=GPU)
    assert acked and nxt.task_id == "t-2"
    acked, nxt = q.ack_and_claim(nxt, "gpu", executors=GPU)
    assert acked and nxt is None and q.get("r-1").state == "queued"


def test_lanes():
    assert lane() == "" and lane("torchrun", 4) == ":n4" and lane("ray") == lane("ray", 1) == RAY_LANE
    with pytest.raises(ValueError, match="unknown executor"):
        lane("slurm")


def test_worker_executors_come_from_the_environment(monkeypatch):
    monkeypatch.delenv(EXECUTORS_ENV, raising=False)
    assert WorkerConfig(worker_id="w").executors == ("torchrun",)
    monkeypatch.setenv(EXECUTORS_ENV, " torchrun, ray ,")
    assert WorkerConfig(worker_id="w").executors == ("torchrun", "ray")
    monkeypatch.setenv(EXECUTORS_ENV, "ray")
    with pytest.raises(ValueError, match="multi-node Jobs run torchrun only"):
        WorkerConfig(worker_id="w", nnodes=2, group="g")


def test_an_unknown_executor_stops_the_worker_with_exit_2_naming_the_variable(redis_server):
    proc = subprocess.run([sys.executable, "-m", "training.worker", "--idle-exit-seconds", "0"],
                          env=child_env(REDIS_URL=redis_server.url, **{EXECUTORS_ENV: "torchrun,slurm"}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == exit_codes.BAD_INPUT, proc.stderr
    assert "RAGPOOL_EXECUTORS='torchrun,slurm'" in proc.stderr and "Traceback" not in proc.stderr


def test_a_multi_node_ray_run_is_refused_naming_nodes():
    with pytest.raises(SpecError) as err:
        parse_spec({"run_id": "r", "stages": ["retriever"], "executor": "ray", "nodes": 2}, shared_root="/mnt/shared")
    assert [key for key, _ in err.value.problems] == ["nodes"]
