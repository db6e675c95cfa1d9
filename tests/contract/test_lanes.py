"""Lanes with pools (contract/lanes.py): the lane API infra builds KEDA triggers and worker
environments from, and the routing it gives on a real redis-server: a run pinned to a pool is claimed
only by that pool's workers, an unpinned run only by the default pool's, and a pool unknown to the
stack is refused at submit naming ``pool``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tests.support.redis_fixtures import make_spec
from contract.paths import child_env

from contract import exit_codes
from contract.lanes import (
    LANES_ENV, POOLS_ENV, Lane, LaneError, format_lanes, known_lanes, lane_from_suffix, lanes_from_env, parse_lane,
    parse_lanes, worker_env, worker_lanes,
)
from training.scheduler.run_queue import lane
from contract.lanes import PRIORITIES, ready_list
from training.scheduler.spec import SpecError, parse_spec
from contract.env import EXECUTORS_ENV
from training.scheduler.worker.settings import WorkerConfig

ALL_LANES = [Lane(), Lane(nodes=2), Lane(pool="gpu-spot"), Lane(nodes=4, pool="gpu-spot"), Lane("ray")]


def test_suffixes_names_and_ready_lists():
    assert [x.suffix for x in ALL_LANES] == ["", ":n2", ":pool:gpu-spot", ":pool:gpu-spot:n4", ":ray"]
    assert [x.name for x in ALL_LANES] == ["torchrun", "torchrun.n2", "pool.gpu-spot", "pool.gpu-spot.n4", "ray"]
    assert Lane(pool="a").ready_lists() == [f"ready:{p}:pool:a" for p in PRIORITIES]
    assert PRIORITIES[0] == "high", "claim order: highest priority first"
    assert Lane(nodes=2).ready_keys("ragpool-team-a") == [f"ragpool-team-a:ready:{p}:n2" for p in PRIORITIES]
    for x in ALL_LANES:
        assert parse_lane(x.name) == x and lane_from_suffix(x.suffix) == x
        assert lane(x.executor, x.nodes, x.pool) == x.suffix, "run_queue.lane delegates to lanes.py"
        assert x.ready_lists()[0] == ready_list(PRIORITIES[0], x.suffix)


@pytest.mark.parametrize("bad", ["", "torchrun.n1", "torchrun.n02", "pool.", "pool.A", "gpu", "ray.n2", "pool.a.b"])
def test_a_bad_lane_name_is_refused_naming_the_variable(bad):
    with pytest.raises(LaneError, match=LANES_ENV):
        parse_lane(bad)


def test_lane_rules():
    with pytest.raises(LaneError, match="unknown executor"):
        Lane("slurm")
    with pytest.raises(LaneError, match="ray lane"):
        Lane("ray", pool="gpu")
    with pytest.raises(LaneError, match="same node count"):
        parse_lanes("torchrun,torchrun.n2")
    assert lane_from_suffix(":bogus") is None and lane_from_suffix(":pool:x:y") is None
    assert known_lanes([":ray", ":pool:a", ":whatever"]) == [Lane("ray"), Lane(), Lane(pool="a")]


def test_worker_lanes_of_each_kind_of_worker():
    assert worker_lanes("gpu-spot", is_default_pool=True) == (Lane(pool="gpu-spot"), Lane())
    assert worker_lanes("gpu-big", is_default_pool=False) == (Lane(pool="gpu-big"),)
    assert worker_lanes("gpu-big", is_default_pool=False, nodes=2) == (Lane(nodes=2, pool="gpu-big"),)
    assert worker_lanes("gpu-spot", is_default_pool=True, nodes=2) == (Lane(nodes=2, pool="gpu-spot"), Lane(nodes=2))
    assert worker_lanes(None, is_default_pool=False, executors=("ray",)) == (Lane("ray"),)
    env = worker_env(worker_lanes("gpu-spot", is_default_pool=True, nodes=2))
    assert env == {LANES_ENV: "pool.gpu-spot.n2,torchrun.n2", "RAGPOOL_NNODES": "2"}


def test_the_worker_claims_exactly_the_lanes_of_its_environment(monkeypatch):
    monkeypatch.delenv(EXECUTORS_ENV, raising=False)
    monkeypatch.delenv(LANES_ENV, raising=False)
    assert WorkerConfig(worker_id="w").lanes == (Lane(),), "no RAGPOOL_LANES: today's unpinned lanes"
    monkeypatch.setenv(EXECUTORS_ENV, "torchrun,ray")
    assert WorkerConfig(worker_id="w").lanes == (Lane(), Lane("ray")), "RAGPOOL_EXECUTORS keeps working"
    monkeypatch.delenv(EXECUTORS_ENV)
    for key, value in worker_env(worker_lanes("gpu-a", is_default_pool=False, nodes=2)).items():
        monkeypatch.setenv(key, value)
    config = WorkerConfig(worker_id="w", group="job-1")
    assert config.lanes == (Lane(nodes=2, pool="gpu-a"),) and config.nnodes == 2 and config.executors == ("torchrun",)
    monkeypatch.setenv("RAGPOOL_NNODES", "1")
    with pytest.raises(LaneError, match="RAGPOOL_NNODES=1"):
        WorkerConfig(worker_id="w")
    monkeypatch.setenv(LANES_ENV, "ray")
    monkeypatch.setenv(EXECUTORS_ENV, "torchrun")
    with pytest.raises(ValueError, match="disagrees"):
        WorkerConfig(worker_id="w")
    assert lanes_from_env(("torchrun",), 1, environ={LANES_ENV: "ray,pool.x"}) == (Lane("ray"), Lane(pool="x"))


def test_runs_go_to_the_workers_of_their_pool(make_queue):
    q = make_queue()
    q.submit(make_spec("pinned-a", pool="gpu-a", priority="low"))
    q.submit(make_spec("pinned-b", pool="gpu-b"))
    q.submit(make_spec("unpinned"))
    q.submit(make_spec("unpinned-2n", nodes=2))
    q.submit(make_spec("pinned-a-2n", nodes=2, pool="gpu-a", priority="high"))
    a_default = worker_lanes("gpu-a", is_default_pool=True)
    b_other = worker_lanes("gpu-b", is_default_pool=False)
    assert q.claim("b", lanes=b_other).task_id == "pinned-b"
    assert q.claim("b", lanes=b_other) is None, "a non-default pool never takes unpinned runs"
    assert q.claim("a", lanes=a_default).task_id == "unpinned", "normal before low, across the worker's lanes"
    assert q.claim("a", lanes=a_default).task_id == "pinned-a"
    assert q.claim("a", lanes=a_default) is None, "multi-node runs need a Job of that size"
    a2 = worker_lanes("gpu-a", is_default_pool=True, nodes=2)
    assert [q.claim("a2", nodes=2, lanes=a2).task_id for _ in range(2)] == ["pinned-a-2n", "unpinned-2n"]
    assert q.claim("b", run_id="pinned-a", lanes=b_other) is None


def test_a_pinned_run_keeps_its_lane_through_release_and_retry(make_queue):
    q = make_queue()
    q.submit(make_spec("p", pool="gpu-b", max_attempts=1))
    b = worker_lanes("gpu-b", is_default_pool=False)
    claim = q.claim("b", lanes=b)
    assert q.release(claim) == "released"
    assert q.claim("a", lanes=worker_lanes("gpu-a", is_default_pool=True)) is None
    claim = q.claim("b", lanes=b)
    assert q.fail(claim, "boom") == "dead" and q.retry("p") == "requeued"
    assert q.client.llen(q.prefix + Lane(pool="gpu-b").ready_lists()[1]) == 1


def test_pool_in_a_spec(monkeypatch):
    monkeypatch.setenv(POOLS_ENV, "gpu-spot,gpu-big")
    spec = make_spec("r", pool="gpu-big")
    assert spec.pool == "gpu-big" and parse_spec(spec.to_payload(), shared_root="/mnt/shared") == spec
    assert "pool" not in make_spec("u").to_payload(), "unpinned payloads stay as they were"
    for fields, says in [({"pool": "gpu-small"}, "does not exist in this stack; pools: gpu-spot, gpu-big"),
                         ({"pool": "Bad_Pool"}, "DNS label"),
                         ({"pool": "gpu-spot", "executor": "ray"}, "picks a pool per stage")]:
        with pytest.raises(SpecError) as err:
            make_spec("r", **fields)
        assert [k for k, _ in err.value.problems] == ["pool"] and says in str(err.value)
    monkeypatch.delenv(POOLS_ENV)
    assert make_spec("r", pool="anything").pool == "anything", "unknown pools: nothing to check against"


def test_submit_of_an_unknown_pool_exits_2_naming_pool(redis_server, tmp_path):
    spec = tmp_path / "run.yaml"
    spec.write_text("run_id: r1\nstages: [retriever]\npool: gpu-nope\n")
    proc = subprocess.run([sys.executable, "-m", "training.scheduler.cli", "submit", str(spec)],
                          env=child_env(REDIS_URL=redis_server.url, RAGPOOL_QUEUE_NAMESPACE="lanes-cli",
                                             RAGPOOL_SHARED_ROOT=str(tmp_path), **{POOLS_ENV: "gpu-spot"}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == exit_codes.BAD_INPUT, proc.stderr
    assert "pool: pool 'gpu-nope' does not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert redis_server.client().exists("lanes-cli:task:r1") == 0, "nothing enqueued"


def test_format_and_parse_round_trip():
    assert parse_lanes(format_lanes(ALL_LANES[2:3] + ALL_LANES[0:1])) == (Lane(pool="gpu-spot"), Lane())


def test_a_worker_of_one_priority_claims_only_runs_of_it(make_queue, monkeypatch):
    """RAGPOOL_PRIORITIES: parsed in claim order, refused naming the variable, in the worker's config; the claim
    script takes the worker's priorities with its lanes (``{"lanes": [...], "priorities": [...]}``) and leases
    only runs of those, ``run_id`` included; a plain list of lanes is every priority, as before."""
    import json

    from contract.lanes import PRIORITIES_ENV, parse_priorities, priorities_from_env

    assert parse_priorities("low, high") == ("high", "low") and parse_priorities("") == PRIORITIES
    with pytest.raises(LaneError, match=f"{PRIORITIES_ENV}='urgent'"):
        parse_priorities("urgent")
    assert priorities_from_env({}) == PRIORITIES
    lanes = worker_lanes("gpu-a", is_default_pool=True)
    assert worker_env(lanes, ["low"])[PRIORITIES_ENV] == "low" and PRIORITIES_ENV not in worker_env(lanes)
    monkeypatch.setenv(PRIORITIES_ENV, "normal")
    assert WorkerConfig(worker_id="w").priorities == ("normal",)

    q = make_queue()
    for run_id, prio in (("h", "high"), ("n", "normal"), ("l", "low")):
        q.submit(make_spec(run_id, pool="gpu-a", priority=prio))

    def claim(priorities, run_id: str = "") -> list[str]:
        lanes_json = json.dumps({"lanes": [lane.suffix for lane in lanes], "priorities": priorities})
        return [c.split("\x1f")[0] for c in q._call("claim", "w", "nonce", 30, run_id, 3, lanes_json)]

    assert claim(["low"], run_id="h") == [], "a queued run of another priority is not this worker's"
    assert claim(["low", "normal"]) == ["n", "l"], "its priorities only, highest first"
    assert claim(["low"]) == []
    assert claim(["high"], run_id="h") == ["h"]
