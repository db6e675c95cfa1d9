"""A gang's two Redis keys (training/scheduler/worker/group.py) against a real redis-server: their names (the
worker pods of one Job meet there, so they never change), what each call leaves in them and their time to live."""

from __future__ import annotations

from tests.support.redis_fixtures import make_spec

from training.scheduler.worker.group import GangGroup


def test_index_0_publishes_its_run_and_the_followers_join_under_the_groups_keys(make_queue, namespace):
    q = make_queue()
    q.submit(make_spec("gang-run", nodes=2))
    claim = q.claim("w", nodes=2)
    gang = GangGroup(q, "job-1", lease_seconds=10)
    assert gang.ttl_s == 21 and gang.read() is None and gang.members() == set()

    gang.publish(claim, {"state": "gathering", "config": "/x/run.yaml"})
    assert gang.read() == {"task_id": "gang-run", "attempt": 1, "state": "gathering", "config": "/x/run.yaml"}
    assert 0 < q.client.ttl(f"{namespace}:group:job-1") <= 21
    gang.join("gang-run-a1/1")
    gang.join("gang-run-a1/go")
    assert gang.members() == {"gang-run-a1/1", "gang-run-a1/go"}
    assert q.client.smembers(f"{namespace}:group:job-1:joined") == gang.members()
    assert 0 < q.client.ttl(f"{namespace}:group:job-1:joined") <= 21
    assert GangGroup(q, "job-2", lease_seconds=10).read() is None, "another Job's gang is another key"

    q.client.expire(f"{namespace}:group:job-1", 2)
    gang.touch()  # index 0's heartbeat
    assert q.client.ttl(f"{namespace}:group:job-1") > 2
    gang.reset_members()
    assert gang.members() == set() and gang.read() is not None
    gang.clear()
    assert gang.read() is None and not q.client.keys(f"{namespace}:group:*")
