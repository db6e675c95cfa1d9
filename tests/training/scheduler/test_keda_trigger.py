"""The trigger counts right: against a real redis-server holding a real queue in every state, the
exact command KEDA's Redis scaler runs (bench/keda_scaledjob.py ``REDIS_SCALER_LUA``, transcribed from
kedacore/keda v2.20.2 pkg/scalers/redis_scaler.go: ``EVAL <script> 1 <listName>``, which is LLEN
for a list) on each lane's ready lists, one trigger per list summed over the active ones
(``multipleScalersCalculation: sum``, pkg/scaling/scaledjob/metrics.go), returns the runs that
need a worker in that lane, and nothing from another lane or another team's namespace. The
keeper's tick (lua/tick.lua) is what makes a lapsed lease and a due retry count again with zero
workers."""

from __future__ import annotations

import json
import time

from tests.support.redis_fixtures import make_spec

from bench.keda_scaledjob import redis_list_length as list_length
from bench.keda_scaledjob import redis_trigger_is_active

from contract.lanes import Lane, lane_of, worker_lanes
from training.scheduler.run_queue import TaskQueue

DEFAULT, TWO, POOL_B, RAY = Lane(), Lane(nodes=2), Lane(pool="gpu-b"), Lane("ray")
LANES = (DEFAULT, TWO, POOL_B, RAY, Lane(nodes=2, pool="gpu-b"))


def _needing_a_worker(q: TaskQueue) -> dict[Lane, int]:
    """Independent of the lists: the queued tasks of each lane, from the task hashes."""
    out = {lane: 0 for lane in LANES}
    for info in q.list(limit=10_000):
        if info.state == "queued":
            spec = json.loads(info.spec_json)
            lane = lane_of(spec.get("executor", "torchrun"), spec.get("nodes", 1), spec.get("pool"))
            out[lane] += 1
    return out


def lane_metric(client, list_names: list[str]) -> int:
    """A ScaledJob's queue length over one Redis trigger per list, ``sum`` of the active ones."""
    lengths = [list_length(client, name) for name in list_names]
    return sum(n for n in lengths if redis_trigger_is_active(n))


def _keda(q: TaskQueue) -> dict[Lane, int]:
    return {lane: lane_metric(q.client, lane.ready_keys(q.prefix[:-1])) for lane in LANES}


def test_the_keda_redis_trigger_counts_exactly_the_runs_that_need_a_worker(redis_server, namespace):
    client = redis_server.client()
    q = TaskQueue(client, namespace=namespace, lease_seconds=0.3, backoff_base_s=0.4, backoff_max_s=0.4)
    team = TaskQueue(client, namespace=namespace + "-team", lease_seconds=30)
    any_worker = worker_lanes("gpu-a", is_default_pool=True)

    # queued at each priority, in the default lane, and in the other lanes
    for prio in ("high", "normal", "low"):
        q.submit(make_spec(f"q-{prio}", priority=prio))
    q.submit(make_spec("q-two", nodes=2, priority="low"))
    q.submit(make_spec("q-pinned", pool="gpu-b", priority="high"))
    q.submit(make_spec("q-ray", executor="ray"))
    # another team's queued runs in the same lanes
    team.submit(make_spec("t-1"))
    team.submit(make_spec("t-2", pool="gpu-b"))
    # done, cancelled, claimed (running), released, dead then retried, failed waiting out its backoff
    for run_id in ("done", "cancelled", "running", "released", "retried", "backoff", "lapsed", "lapsed-dead"):
        q.submit(make_spec(run_id, priority="high", max_attempts=1 if run_id in ("retried", "lapsed-dead") else 3))
    assert q.cancel("cancelled") == "cancelled"
    claims = {rid: q.claim("w", lanes=any_worker, run_id=rid)
              for rid in ("done", "running", "released", "retried", "backoff", "lapsed", "lapsed-dead")}
    assert all(c is not None for c in claims.values())
    assert q.ack(claims["done"])
    assert q.release(claims["released"]) == "released"
    assert q.fail(claims["retried"], "boom") == "dead" and q.retry("retried") == "requeued"
    assert q.fail(claims["backoff"], "transient") == "retry"
    for run_id in ("running",):  # keep its lease alive while the others lapse
        q.heartbeat(claims[run_id], "w")
    time.sleep(0.5)  # the two 'lapsed' leases (0.3 s) and the backoff (0.4 s) are over; nobody claims

    want_before = {DEFAULT: 3 + 2, TWO: 1, POOL_B: 1, RAY: 1, LANES[4]: 0}  # q-* + released + retried
    assert _keda(q) == want_before == _needing_a_worker(q), "without a tick, lapsed and due runs are not counted"

    # 'running' keeps heartbeating; the keeper's tick reaps the lapsed leases and promotes the due retry
    q.heartbeat(claims["running"], "w")
    q.lease_seconds = 30.0
    moved = q.tick([namespace, namespace + "-team"])
    assert moved == {namespace: (2, 1), namespace + "-team": (0, 0)}
    assert q.get("lapsed").state == "queued" and q.get("lapsed-dead").state == "dead"
    assert q.get("backoff").state == "queued" and q.get("running").state == "running"
    want = {DEFAULT: 3 + 2 + 2, TWO: 1, POOL_B: 1, RAY: 1, LANES[4]: 0}  # + lapsed + backoff
    assert _keda(q) == want == _needing_a_worker(q)
    assert {lane: s.queued for lane, s in q.lane_stats().items() if lane in LANES} == {
        lane: n for lane, n in want.items() if n or lane in (DEFAULT, TWO, POOL_B, RAY)}
    # the other team: its own lists only
    assert {lane: lane_metric(client, lane.ready_keys(namespace + "-team")) for lane in LANES} == {
        DEFAULT: 1, TWO: 0, POOL_B: 1, RAY: 0, LANES[4]: 0}
    # per priority, one trigger per list: the high list holds exactly the high runs
    assert list_length(client, DEFAULT.ready_keys(namespace)[0]) == 1 + 2 + 2  # q-high, released, retried, lapsed, backoff
    assert list_length(client, f"{namespace}:no-such-list") == 0

    # each lane's worker drains exactly its lane's count, and nothing is left for anyone
    for lane, lanes in ((DEFAULT, (DEFAULT,)), (TWO, (TWO,)), (POOL_B, (POOL_B,)), (RAY, (RAY,))):
        got = 0
        while q.claim("drain", lanes=lanes, nodes=lane.nodes) is not None:
            got += 1
        assert got == want[lane], lane
    assert all(v == 0 for v in _keda(q).values())
