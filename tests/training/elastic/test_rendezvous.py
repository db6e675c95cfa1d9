"""The rendezvous on Redis (training/elastic/rendezvous.py) against a real redis-server: the state's compare-and-set
(two writers, the stale token loses), its keys per run and attempt with a TTL, and the agents' Store."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from training.elastic.rendezvous import RedisRendezvousBackend, RedisStore, key_prefix


@pytest.fixture
def client(redis_server):
    c = redis_server.client()
    yield c
    c.close()


def test_two_writers_the_stale_token_loses(client, namespace) -> None:
    a = RedisRendezvousBackend(client, "run-a1", namespace=namespace, ttl_s=60)
    b = RedisRendezvousBackend(client, "run-a1", namespace=namespace, ttl_s=60)
    assert a.get_state() is None
    state, token, won = a.set_state(b"round0")
    assert (state, won) == (b"round0", True)
    # Both read the same token; a writes first, b's write with the now stale token is refused and gets a's state.
    assert b.get_state() == (b"round0", token)
    state_a, token_a, won_a = a.set_state(b"a-wins", token)
    state_b, token_b, won_b = b.set_state(b"b-loses", token)
    assert won_a and not won_b and (state_b, token_b) == (b"a-wins", token_a) != (b"a-wins", token)
    # A writer that saw no state cannot overwrite one (token None: only if absent).
    assert b.set_state(b"blind") == (b"a-wins", token_a, False)
    assert a.get_state() == (b"a-wins", token_a)


def test_keys_are_per_run_and_attempt_and_expire(client, namespace) -> None:
    RedisRendezvousBackend(client, "run-a1", namespace=namespace, ttl_s=60).set_state(b"x")
    other = RedisRendezvousBackend(client, "run-a2", namespace=namespace, ttl_s=60)
    assert other.get_state() is None  # the next attempt starts from nothing
    key = f"{key_prefix('run-a1', namespace)}:state"
    assert key == f"{namespace}:rdzv:run-a1:state" and 0 < client.ttl(key) <= 60
    # Expired (or deleted) under a writer holding a token: it is told there is no state, and writes nothing.
    _, token = other.set_state(b"y")[:2]
    client.delete(f"{key_prefix('run-a2', namespace)}:state")
    assert other.set_state(b"z", token) is None and other.get_state() is None
    with pytest.raises(ValueError, match="rdzv-id"):
        key_prefix("bad id/../x", namespace)


def test_the_store_serves_the_agents(client, namespace) -> None:
    redis_store = RedisStore(client, "run-a1", namespace=namespace, ttl_s=60)  # held: the C++ side calls into it
    store = dist.PrefixStore("torch.rendezvous.run-a1.0", redis_store)
    store.set("MASTER_ADDR", b"10.0.0.7")
    assert store.get("MASTER_ADDR") == b"10.0.0.7" and store.multi_get(["MASTER_ADDR"]) == [b"10.0.0.7"]
    assert [store.add("joined", 1) for _ in range(3)] == [1, 2, 3] and store.get("joined") == b"3"
    assert store.compare_set("k", "", "v1") == b"v1"        # absent + expected "": created
    assert store.compare_set("k", "other", "v2") == b"v1"   # mismatch: the current value, unchanged
    assert store.compare_set("k", "v1", "v2") == b"v2"
    assert store.check(["MASTER_ADDR", "k"]) and not store.check(["never"])
    with pytest.raises(dist.DistStoreError, match="never"):
        store.wait(["never"], timedelta(seconds=0.2))
    assert all(0 < client.ttl(k) <= 60 for k in client.keys(f"{namespace}:rdzv:run-a1:kv:*"))
