"""Connection settings, Sentinel settings and the retry/reconnect paths, against real redis-servers."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from tests.support.waits import wait_for

from training.scheduler.redis_conn import (
    DEFAULT_REPLICA_WAIT_MS,
    NotReplicatedError,
    QueueRetry,
    RedisConfigError,
    SENTINEL_REQUIRED_REPLICAS,
    RedisSettings,
    connect,
    is_temporary_error,
    reconnect,
    settings_from_env,
    single_attempt,
)


# -- settings ---------------------------------------------------------------------------------

def test_sentinel_settings_from_env():
    s = settings_from_env({"REDIS_SENTINELS": "10.0.0.5:26380, sentinel-b ,[fd00::1]:26381",
                           "REDIS_SENTINEL_MASTER": "queue", "REDIS_PASSWORD": "pw",
                           "REDIS_URL": "rediss://ignored:6379/3"})
    assert s.sentinels == (("10.0.0.5", 26380), ("sentinel-b", 26379), ("fd00::1", 26381))
    assert s.sentinel_master == "queue" and s.tls and s.db == 3
    assert s.endpoint == "sentinel://10.0.0.5:26380,sentinel-b:26379,fd00::1:26381/queue"
    # REDIS_URL alone keeps working exactly as before.
    plain = settings_from_env({"REDIS_URL": "redis://:hunter2@h:1/0"})
    assert plain.sentinels == () and plain.endpoint == "redis://:***@h:1/0"
    assert plain.replica_wait_ms == DEFAULT_REPLICA_WAIT_MS


@pytest.mark.parametrize("env, variable", [
    ({"REDIS_SENTINELS": "10.0.0.5:26379"}, "REDIS_SENTINEL_MASTER"),
    ({"REDIS_SENTINELS": "10.0.0.5:99999", "REDIS_SENTINEL_MASTER": "m"}, "REDIS_SENTINELS"),
    ({"REDIS_SENTINELS": "a b:1", "REDIS_SENTINEL_MASTER": "m"}, "REDIS_SENTINELS"),
    ({"REDIS_SENTINELS": " , ", "REDIS_SENTINEL_MASTER": "m"}, "REDIS_SENTINELS"),
    ({"REDIS_SENTINELS": "  ", "REDIS_SENTINEL_MASTER": "m"}, None),  # blank = not set
    ({"REDIS_SENTINELS": "h:1", "REDIS_SENTINEL_MASTER": "m\n"}, "REDIS_SENTINEL_MASTER"),
    ({"REDIS_REPLICA_WAIT_MS": "-1"}, "REDIS_REPLICA_WAIT_MS"),
    ({"REDIS_REPLICA_WAIT_MS": "1e3"}, "REDIS_REPLICA_WAIT_MS"),
    ({"REDIS_REPLICA_WAIT_MS": "600000"}, "REDIS_REPLICA_WAIT_MS"),
    ({"REDIS_REQUIRED_REPLICAS": "-1"}, "REDIS_REQUIRED_REPLICAS"),
    ({"REDIS_REQUIRED_REPLICAS": "one"}, "REDIS_REQUIRED_REPLICAS"),
    ({"REDIS_REQUIRED_REPLICAS": "17"}, "REDIS_REQUIRED_REPLICAS"),
    # WAIT 1 0 would block forever: a required replica needs a bounded wait.
    ({"REDIS_REQUIRED_REPLICAS": "1", "REDIS_REPLICA_WAIT_MS": "0"}, "REDIS_REPLICA_WAIT_MS"),
])
def test_bad_sentinel_and_wait_settings_name_the_variable(env, variable):
    if variable is None:
        assert settings_from_env(env).sentinels == ()
        return
    with pytest.raises(RedisConfigError, match=variable):
        settings_from_env(env)


def test_replica_wait_setting():
    assert settings_from_env({"REDIS_REPLICA_WAIT_MS": "0"}).replica_wait_ms == 0
    assert settings_from_env({"REDIS_REPLICA_WAIT_MS": "250"}).replica_wait_ms == 250
    assert settings_from_env({}).required_replicas == 0  # unset: no WAIT (single-node dev Redis)
    assert settings_from_env({"REDIS_REQUIRED_REPLICAS": " 2 "}).required_replicas == 2


def test_a_sentinel_set_waits_for_a_replica_unless_told_otherwise():
    """Round-4 audit, item 5: with only the Sentinel variables set (as a new user sets them), every write used to
    skip WAIT, and a failover lost acknowledged submissions. The worker, the keeper and the CLI all read their
    settings here (settings_from_env), so the rule is the same in each."""
    sentinel = {"REDIS_SENTINELS": "10.0.0.1:26379,10.0.0.2", "REDIS_SENTINEL_MASTER": "queue"}
    assert settings_from_env(sentinel).required_replicas == SENTINEL_REQUIRED_REPLICAS == 1
    assert settings_from_env({**sentinel, "REDIS_REQUIRED_REPLICAS": "0"}).required_replicas == 0  # explicit only
    assert settings_from_env({**sentinel, "REDIS_REQUIRED_REPLICAS": "2"}).required_replicas == 2
    assert settings_from_env({"REDIS_URL": "redis://10.0.0.1:6379/0"}).required_replicas == 0  # no Sentinel: none


def test_the_worker_keeper_and_cli_read_their_redis_settings_from_one_place():
    import ast
    from pathlib import Path

    import training.scheduler

    root = Path(training.scheduler.__path__[0])
    for rel in ("worker/loop.py", "keeper.py", "cli_route.py"):
        calls = {n.func.id for n in ast.walk(ast.parse((root / rel).read_text()))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "settings_from_env" in calls and "RedisSettings" not in calls, rel


# -- which errors are temporary ---------------------------------------------------------------

@pytest.mark.parametrize("exc, temporary", [
    (redis.ConnectionError("Connection closed by server."), True),
    (redis.TimeoutError("Timeout reading from socket"), True),
    (redis.BusyLoadingError("Redis is loading the dataset in memory"), True),
    (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), True),
    (redis.ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed"), True),
    (redis.ResponseError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), True),
    (NotReplicatedError("submit", wait_ms=10), True),
    (redis.AuthenticationError("invalid username-password pair"), False),
    (redis.exceptions.NoPermissionError("NOPERM this user has no permissions"), False),
    (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
    (redis.ResponseError("ERR user_script:3: attempt to compare nil with number"), False),
    (ValueError("not redis at all"), False),
])
def test_is_temporary_error(exc, temporary):
    assert is_temporary_error(exc) is temporary


# -- retries against real servers -------------------------------------------------------------

def _restart_later(server, delay_s: float) -> threading.Thread:
    def later():
        time.sleep(delay_s)
        server.start()

    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    return thread


def test_idempotent_commands_ride_out_a_restart_single_attempt_ones_do_not(own_redis):
    server = own_redis(appendonly=True)
    settings = RedisSettings(url=server.url, retries=8, retry_base_s=0.1, retry_cap_s=0.5)
    client = connect(settings)
    once = single_attempt(client)
    assert isinstance(client.get_retry(), QueueRetry) and client.get_retry().get_retries() == 8
    client.set("k", "1")
    once.set("k", "2")  # same server, same settings
    server.kill()
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        once.get("k")  # never resent: the caller decides
    assert time.monotonic() - started < 1.0
    restarter = _restart_later(server, 1.0)
    assert client.get("k") == "2"  # retried with backoff until the server is back
    restarter.join()


def test_readonly_after_a_demotion_is_retried_until_a_primary_answers(own_redis):
    primary = own_redis()
    other = own_redis()
    client = connect(RedisSettings(url=primary.url, retries=10, retry_base_s=0.05, retry_cap_s=0.3))
    client.set("before", "1")
    admin = primary.client()
    admin.replicaof("127.0.0.1", other.port)  # demoted: writes now get READONLY

    def promote_again():
        time.sleep(0.8)
        admin.replicaof("NO", "ONE")

    thread = threading.Thread(target=promote_again, daemon=True)
    thread.start()
    with pytest.raises(redis.exceptions.ReadOnlyError):
        single_attempt(client).set("after", "1")
    client.set("after", "1")  # READONLY is temporary: retried until the node is a primary again
    thread.join()
    assert admin.get("after") == "1"


def test_a_blocking_pop_cut_by_a_demotion_is_a_temporary_error(own_redis):
    primary = own_redis()
    other = own_redis()
    raw = primary.client()  # no retries: see the reply itself
    errors: list[Exception] = []

    def pop():
        try:
            raw.blpop(["wake"], timeout=10)
        except Exception as exc:  # recorded for the assertion
            errors.append(exc)

    thread = threading.Thread(target=pop)
    thread.start()
    time.sleep(0.3)
    primary.client().replicaof("127.0.0.1", other.port)
    thread.join(timeout=10)
    assert len(errors) == 1 and str(errors[0]).startswith("UNBLOCKED"), errors
    assert is_temporary_error(errors[0])


def test_reconnect_drops_pooled_connections(own_redis):
    server = own_redis()
    client = connect(RedisSettings(url=server.url))
    once = single_attempt(client)
    client.ping()
    once.ping()
    ids = {server.client().client_id()}
    before = {c["id"] for c in server.client().client_list()} - ids
    reconnect(client, once)
    client.ping()
    after = {c["id"] for c in server.client().client_list()}
    assert before and not before & after  # every old connection is gone; the next command opened a new one


def test_required_replicas_is_configuration_never_what_the_primary_reports(own_redis):
    """A primary without replicas (a demoted primary in a failover looks like this) does not
    turn the wait off: the write is refused as unconfirmed; and a primary with replicas is not
    waited for when none are required (the dev single node)."""
    from tests.support.redis_fixtures import make_spec

    from training.scheduler.run_queue import TaskQueue, open_queue

    alone = own_redis()
    env = {"REDIS_URL": alone.url, "REDIS_REQUIRED_REPLICAS": "1", "REDIS_REPLICA_WAIT_MS": "100"}
    q = open_queue(settings_from_env(env), namespace="req")
    assert (q.required_replicas, q.replica_wait_ms) == (1, 100)
    with pytest.raises(NotReplicatedError) as err:
        q.submit(make_spec("r-1"))
    assert (err.value.required, err.value.confirmed) == (1, 0)
    assert "0 of the 1 required replica(s) had it within 100 ms" in str(err.value)
    assert q.get("r-1").state == "queued"  # on the primary, just not confirmed
    with pytest.raises(NotReplicatedError):  # a fresh queue (a new process) follows the same rule
        open_queue(settings_from_env(env), namespace="req").submit(make_spec("r-1"))

    primary = own_redis(extra_args=("--repl-diskless-sync-delay", "0"))
    own_redis(replica_of=primary.port)
    wait_for(lambda: primary.client().info("replication").get("connected_slaves", 0) >= 1, 10,
             "the replica to connect", seen=lambda: primary.client().info("replication"))
    plain = open_queue(settings_from_env({"REDIS_URL": primary.url}), namespace="req")
    assert plain.required_replicas == 0
    plain.submit(make_spec("r-2"))
    assert "replica_waits_total" not in primary.client().hgetall("req:stats")  # no WAIT was sent
    with pytest.raises(ValueError, match="replica_wait_ms"):
        TaskQueue(primary.client(), required_replicas=1, replica_wait_ms=0)
